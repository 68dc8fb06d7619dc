"""Attention sinks on an NVIDIA GPU: the xla path in bfloat16 (forward, residual, gradients with d sinks)
against float64, decode's masked path and serving's xla path; auto runs xla there, cuDNN and attnlab's
Pallas kernels refuse, saying why."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
import attnlab.reference.inputs
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.float64 import check_close, reference_attention_grads, rel_l2
from attnlab.reference.serving64 import reference_serving_attention

pytestmark = pytest.mark.gpu

N, K, H = 8, 2, 64
SINKS = jnp.linspace(-2.0, 3.0, N, dtype=jnp.float32)


def test_xla_sinks_bf16_match_float64_and_cudnn_refuses():
    q, k, v = attnlab.reference.inputs.random_qkv(2, 256, 256, N, K, H, "bfloat16", seed=1)
    kw = dict(is_causal=True, local_window_size=(64, 0), key_value_seq_lengths=jnp.array([256, 100], jnp.int32))
    assert attnlab.explain(q, k, v, sinks=SINKS, **kw).chosen == "xla"
    with pytest.raises(attnlab.UnsupportedError, match="cudnn: sinks"):
        attnlab.attention(q, k, v, implementation="cudnn", sinks=SINKS, **kw)
    fn = jax.jit(lambda q, k, v, s: attnlab.attention(q, k, v, sinks=s, return_residual=True, **kw))
    out = fn(q, k, v, SINKS)
    assert check_close(out, q, k, v, sinks=SINKS, return_residual=True, **kw).ok
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    ct = jax.random.normal(jax.random.PRNGKey(5), q.shape)
    grads = jax.grad(lambda *a: jnp.sum(fn(*a)[0].astype(jnp.float32) * ct), argnums=(0, 1, 2, 3))(q32, k32, v32, SINKS)
    for g, r in zip(grads, reference_attention_grads(q32, k32, v32, ct, sinks=SINKS, **kw)):
        assert rel_l2(np.asarray(g), r) < 1e-2


def test_decode_and_serving_generic_paths_with_sinks():
    q, k, v = attnlab.reference.inputs.random_qkv(2, 4, 512, N, K, H, "bfloat16", seed=2)
    L = jnp.array([512, 77], jnp.int32)
    out = attnlab.decode_attention(q, k, v, L, sinks=SINKS)
    assert check_decode_close(out, q, k, v, L, sinks=SINKS).ok
    with pytest.raises(attnlab.UnsupportedError, match="attnlab-decode: sinks"):
        attnlab.decode_attention(q, k, v, L, implementation="attnlab-decode", sinks=SINKS)
    qs, starts = q.reshape(8, N, H), jnp.array([0, 3, 8])
    out = attnlab.serving_attention(qs, k, v, starts, L, sinks=SINKS)
    ref = reference_serving_attention(qs, k, v, starts, L, sinks=SINKS)
    assert rel_l2(np.asarray(out, np.float32), ref) < 1e-2
