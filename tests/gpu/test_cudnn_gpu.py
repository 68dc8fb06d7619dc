"""cuDNN and auto on an NVIDIA GPU, against the float64 reference (run on the H200)."""
import jax
import jax.numpy as jnp
import pytest

import attnlab
from attnlab import UnsupportedError
from attnlab.reference import cases
from attnlab.reference.float64 import check_close, reference_attention_grads, rel_l2

pytestmark = pytest.mark.gpu

CUDNN_MODES = [m for m in cases.MASK_MODES if not ("window" in m and "causal" not in m)]
SHAPES = {  # (B, T, S, N, K, H)
    "mha": (2, 64, 64, 4, 4, 64),
    "gqa4": (2, 64, 128, 8, 2, 64),
    "mqa": (1, 128, 128, 8, 1, 128),
    "t_ne_s": (2, 32, 96, 4, 2, 64),
    "decode": (4, 1, 256, 8, 2, 128),
    "h256": (1, 64, 64, 2, 2, 256),
}


def _jit_call(impl, q, k, v, kw):
    static = {n: kw[n] for n in ("is_causal", "local_window_size") if n in kw}
    traced = {n: x for n, x in kw.items() if n not in static}
    fn = lambda q, k, v, t: attnlab.attention(q, k, v, implementation=impl, **t, **static)  # noqa: E731
    return fn, jax.jit(fn)(q, k, v, traced), traced


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("mode", CUDNN_MODES)
@pytest.mark.parametrize("impl", ["cudnn", None])
def test_cudnn_mask_modes(impl, mode, dtype):
    q, k, v, kw = cases.build(mode, batch=2, q_len=64, kv_len=128, heads=8, kv_heads=2, head_dim=64, dtype=dtype, seed=4)
    fn, out, traced = _jit_call(impl, q, k, v, kw)
    verdict = check_close(out, q, k, v, **kw)
    assert verdict.ok, (mode, dtype, verdict)
    assert attnlab.hlo_uses_cudnn(fn, q, k, v, traced), "cuDNN was supported but did not run"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_shapes(shape, dtype, causal):
    B, T, S, N, K, H = SHAPES[shape]
    q, k, v = attnlab.reference.inputs.random_qkv(B, T, S, N, K, H, dtype, seed=B * T + S)
    out = jax.jit(lambda q, k, v: attnlab.attention(q, k, v, is_causal=causal, implementation="cudnn"))(q, k, v)
    verdict = check_close(out, q, k, v, is_causal=causal)
    assert verdict.ok, (shape, verdict)


@pytest.mark.parametrize("mode", ["none", "causal", "padding", "causal+window"])
def test_cudnn_gradients(mode):
    q, k, v, kw = cases.build(mode, batch=2, q_len=64, kv_len=64, heads=4, kv_heads=2, head_dim=64, dtype="bfloat16", seed=9)
    ct = jax.random.normal(jax.random.key(3), q.shape, jnp.float32)
    loss = lambda q, k, v: jnp.sum(attnlab.attention(q, k, v, implementation="cudnn", **kw).astype(jnp.float32) * ct)  # noqa: E731
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    refs = reference_attention_grads(q, k, v, ct, **kw)
    for name, g, r in zip("qkv", grads, refs):
        assert rel_l2(g, r) < 4e-2, (name, rel_l2(g, r))


def test_auto_prefers_cudnn_and_falls_back_with_reason():
    q, k, v = attnlab.reference.inputs.random_qkv(1, 64, 64, 4, 4, 64, "bfloat16")
    assert attnlab.explain(q, k, v).chosen == "cudnn"
    e = attnlab.explain(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32))
    assert e.chosen == "xla" and "float32" in e.reasons["cudnn"]
    with pytest.raises(UnsupportedError, match="cudnn: dtype float32"):
        attnlab.attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), implementation="cudnn")
    q5, k5, v5 = attnlab.reference.inputs.random_qkv(1, 16, 16, 2, 2, 512, "bfloat16")
    with pytest.raises(UnsupportedError, match="head dim 512 > 256"):
        attnlab.attention(q5, k5, v5, implementation="cudnn")


# --- the cases where cuDNN through JAX has been reported silently wrong ---------------

def test_39576_window_without_causal_is_refused_and_auto_is_correct():
    q, k, v = attnlab.reference.inputs.random_qkv(2, 128, 128, 4, 4, 64, "bfloat16", seed=1)
    window = (16, 0)
    with pytest.raises(UnsupportedError, match="39576"):
        attnlab.attention(q, k, v, local_window_size=window, implementation="cudnn")
    e = attnlab.explain(q, k, v, local_window_size=window)
    assert e.chosen != "cudnn"
    out = attnlab.attention(q, k, v, local_window_size=window)
    assert check_close(out, q, k, v, local_window_size=window).ok


def test_32300_window_alone_is_applied():
    q, k, v = attnlab.reference.inputs.random_qkv(2, 128, 128, 4, 4, 64, "bfloat16", seed=2)
    for impl, kw in (("xla", dict(local_window_size=(0, 8))), ("cudnn", dict(local_window_size=(8, 0), is_causal=True)),
                     (None, dict(local_window_size=(8, 8)))):
        out = attnlab.attention(q, k, v, implementation=impl, **kw)
        assert check_close(out, q, k, v, **kw).ok, (impl, kw)


@pytest.mark.parametrize("with_q_lengths", [False, True])
def test_23349_key_value_lengths_respected(with_q_lengths):
    q, k, v = attnlab.reference.inputs.random_qkv(8, 128, 128, 4, 4, 16, "bfloat16", seed=3)
    kv = jnp.array([24, 125, 53, 28, 77, 96, 13, 114], jnp.int32)
    kw = dict(key_value_seq_lengths=kv)
    if with_q_lengths:
        kw["query_seq_lengths"] = jnp.full((8,), 128, jnp.int32)
    out = attnlab.attention(q, k, v, implementation="cudnn", **kw)
    assert check_close(out, q, k, v, **kw).ok


def test_cudnn_causal_is_top_left_aligned_for_t_ne_s():
    q, k, v = attnlab.reference.inputs.random_qkv(1, 32, 128, 4, 4, 64, "bfloat16", seed=5)
    out = attnlab.attention(q, k, v, is_causal=True, implementation="cudnn")
    assert check_close(out, q, k, v, is_causal=True).ok
