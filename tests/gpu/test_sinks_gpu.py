"""Attention sinks on an NVIDIA GPU: the xla path in bfloat16 (forward, residual, gradients with d sinks)
against float64, decode's masked path and serving's xla path; attnlab's kernels (decode: Triton and, at
128 rows per KV head on sm_90, Mosaic GPU; serving) in bfloat16 against float64; cuDNN refuses, saying why."""
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
    out = attnlab.decode_attention(q, k, v, L, sinks=SINKS, implementation="xla")
    assert check_decode_close(out, q, k, v, L, sinks=SINKS).ok
    assert attnlab.explain_decode(q, k, v, L, sinks=SINKS).chosen == "attnlab-decode"   # auto: the kernel
    with pytest.raises(attnlab.UnsupportedError, match="cudnn: sinks"):
        attnlab.decode_attention(q, k, v, L, implementation="cudnn", sinks=SINKS)
    qs, starts = q.reshape(8, N, H), jnp.array([0, 3, 8])
    out = attnlab.serving_attention(qs, k, v, starts, L, sinks=SINKS, implementation="xla")
    ref = reference_serving_attention(qs, k, v, starts, L, sinks=SINKS)
    assert rel_l2(np.asarray(out, np.float32), ref) < 1e-2


#: gpt-oss-20b's attention heads; sinks large enough to move every row (the keys' logits are ~N(0, 1))
OSS_N, OSS_K, OSS_H = 64, 8, 64
OSS_SINKS = jnp.asarray(attnlab.reference.inputs.random_sinks(OSS_N)) + 4.0


@pytest.mark.parametrize("T, layout, cap", [(4, "contig", None), (4, "paged16", 30.0), (16, "contig", None),
                                            (16, "paged16", None)],
                         ids=["triton", "triton-paged-cap", "mosaic", "mosaic-paged"])
def test_decode_kernel_sinks_bf16_match_float64(T, layout, cap):
    """attnlab-decode with sinks: T = 4 (32 rows per KV head: Triton), T = 16 (128 rows: Mosaic GPU on sm_90),
    ragged lengths, contiguous and paged caches, the soft cap, traced sinks under jit."""
    from attnlab.kernels import decode_mgpu as dm
    from attnlab.kernels.pages import to_pages

    q, k, v = attnlab.reference.inputs.random_qkv(4, T, 2048, OSS_N, OSS_K, OSS_H, "bfloat16", seed=T)
    L = jnp.array([2048, 1000, 77, 1500], jnp.int32)
    kc, vc, table = (k, v, None) if layout == "contig" else to_pages(k, v, 16)
    fn = jax.jit(lambda q, k, v, n, t, s: attnlab.decode_attention(q, k, v, n, page_table=t, sinks=s, logits_soft_cap=cap,
                                                                   implementation="attnlab-decode"))
    out = fn(q, kc, vc, L, table, OSS_SINKS)
    verdict = check_decode_close(out, q, k, v, L, sinks=OSS_SINKS, logits_soft_cap=cap)
    assert verdict.ok, verdict
    assert not check_decode_close(out, q, k, v, L, logits_soft_cap=cap).ok, "the sinks change the result"
    if T == 16 and cap is None and jax.devices()[0].device_kind.startswith("NVIDIA H"):   # the Mosaic kernel itself
        out = dm.decode_attention_mgpu(q, kc, vc, L, page_table=table, sinks=OSS_SINKS)
        verdict = check_decode_close(out, q, k, v, L, sinks=OSS_SINKS)
        assert verdict.ok, verdict


def test_serving_kernel_sinks_bf16_match_float64():
    """serving_attention's kernel with sinks: a mixed batch (a prefill chunk of 300 and ragged decodes), paged,
    traced lengths and sinks under jit; auto runs the kernel."""
    from attnlab.kernels.pages import to_pages
    from attnlab.reference.tolerance import rel_l2 as rel

    q_len, kv = np.array([300, 1, 1, 4, 1]), np.array([1800, 2048, 17, 600, 1])
    starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    _, k, v = attnlab.reference.inputs.random_qkv(5, 1, 2048, OSS_N, OSS_K, OSS_H, "bfloat16", seed=4)
    q = jax.random.normal(jax.random.PRNGKey(6), (int(starts[-1]) + 3, OSS_N, OSS_H), jnp.bfloat16)
    kp, vp, table = to_pages(k, v, 16)
    args = (q, kp, vp, jnp.asarray(starts), jnp.asarray(kv, jnp.int32))
    assert attnlab.explain_serving(*args, page_table=table, sinks=OSS_SINKS).chosen == "attnlab-decode"
    out = jax.jit(lambda q, k, v, a, b, t, s: attnlab.serving_attention(q, k, v, a, b, page_table=t, sinks=s))(
        *args, table, OSS_SINKS)
    ref = reference_serving_attention(q, k, v, starts, kv, sinks=OSS_SINKS)
    err = rel(np.asarray(out, np.float64), ref)
    assert err < 1e-2 and rel(ref, reference_serving_attention(q, k, v, starts, kv)) > 10 * err
