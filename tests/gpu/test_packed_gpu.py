"""Packed segments on cuDNN (JAX's packed entry point): output and gradients against float64."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
import attnlab.reference.inputs
from attnlab.core import segments
from attnlab.reference.float64 import check_close, reference_attention_grads, rel_l2

pytestmark = pytest.mark.gpu


def _ids(B, T, n, pad=0):
    ids = segments.docs(B, T, n, seed=3)
    if pad:
        ids[-1, -pad:] = -1
    return jnp.asarray(ids)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("traced", [False, True])
def test_cudnn_packed_matches_float64_with_grads(causal, traced):
    q, k, v = attnlab.reference.inputs.random_qkv(2, 256, 256, 4, 4, 64, "bfloat16", seed=1)
    ids = _ids(2, 256, 4, pad=17)
    kw = dict(is_causal=causal)

    def f(q, k, v, ids):
        return attnlab.attention(q, k, v, implementation="cudnn", query_segment_ids=ids, key_value_segment_ids=ids, **kw)
    fn = jax.jit(f) if traced else jax.jit(lambda q, k, v, ids=ids: f(q, k, v, ids))
    out = fn(q, k, v, ids) if traced else fn(q, k, v)
    ref_kw = dict(query_segment_ids=ids, key_value_segment_ids=ids, **kw)
    v_ = check_close(out, q, k, v, **ref_kw)
    assert v_.ok, v_
    assert not np.any(np.asarray(out[-1, -17:], np.float32))
    ct = jax.random.normal(jax.random.key(2), q.shape, jnp.float32).astype(q.dtype)
    loss = (lambda q, k, v: jnp.sum((fn(q, k, v, ids) if traced else fn(q, k, v)).astype(jnp.float32) * ct))
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for g, r, name in zip(grads, reference_attention_grads(q, k, v, ct, **ref_kw), "qkv"):
        assert rel_l2(g, r) < 2e-2, (name, rel_l2(g, r))


def test_cudnn_packed_refuses_non_contiguous_and_poisons_traced():
    q, k, v = attnlab.reference.inputs.random_qkv(1, 64, 64, 2, 2, 64, "bfloat16", seed=1)
    bad = jnp.asarray([[0] * 16 + [1] * 16 + [0] * 32])
    with pytest.raises(attnlab.UnsupportedError, match="not contiguous"):
        attnlab.attention(q, k, v, implementation="cudnn", query_segment_ids=bad, key_value_segment_ids=bad)
    out = jax.jit(lambda q, k, v, i: attnlab.attention(q, k, v, implementation="cudnn", query_segment_ids=i,
                                                       key_value_segment_ids=i))(q, k, v, bad)
    assert np.all(np.isnan(np.asarray(out, np.float32)))
