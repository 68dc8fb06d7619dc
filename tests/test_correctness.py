"""Every CPU path against the float64 reference, over shapes, mask modes and dtypes."""
import jax
import numpy as np
import pytest

import attnlab
from attnlab.reference import cases
from attnlab.reference.float64 import check_close, reference_attention

SHAPES = {  # (B, T, S, N, K, H); the index is each shape's fixed input seed
    "mha": (2, 16, 16, 4, 4, 16),
    "gqa2": (2, 16, 24, 4, 2, 8),
    "gqa4": (1, 8, 16, 8, 2, 16),
    "gqa8": (1, 12, 12, 8, 1, 8),     # G = 8 is MQA here
    "mqa": (2, 16, 16, 4, 1, 16),
    "decode": (3, 1, 24, 4, 2, 16),   # T = 1
}


def _run(impl, q, k, v, kw):
    return jax.jit(lambda q, k, v, kw: attnlab.attention(q, k, v, implementation=impl, **kw))(q, k, v, kw)


def _jittable(kw):
    # is_causal / local_window_size are static; keep them out of the traced pytree
    static = {k: kw.pop(k) for k in ("is_causal", "local_window_size") if k in kw}
    return kw, static


@pytest.mark.parametrize("impl", ["naive", "xla", None])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", cases.MASK_MODES)
def test_mask_modes_match_reference(impl, dtype, mode):
    q, k, v, kw = cases.build(mode, batch=2, q_len=16, kv_len=24, heads=4, kv_heads=2, head_dim=16, dtype=dtype, seed=3)
    traced, static = _jittable(dict(kw))
    out = jax.jit(lambda q, k, v, t: attnlab.attention(q, k, v, implementation=impl, **t, **static))(q, k, v, traced)
    assert out.shape == q.shape and out.dtype == q.dtype
    verdict = check_close(out, q, k, v, **kw)
    assert verdict.ok, (mode, dtype, verdict)


@pytest.mark.parametrize("impl", ["naive", "xla", None])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("causal", [False, True])
def test_shapes_match_reference(impl, dtype, shape, causal):
    B, T, S, N, K, H = SHAPES[shape]
    q, k, v = attnlab.reference.inputs.random_qkv(B, T, S, N, K, H, dtype, seed=list(SHAPES).index(shape))
    out = jax.jit(lambda q, k, v: attnlab.attention(q, k, v, is_causal=causal, implementation=impl))(q, k, v)
    verdict = check_close(out, q, k, v, is_causal=causal)
    assert verdict.ok, (shape, dtype, verdict)


def test_three_dim_inputs_and_scale():
    q, k, v = attnlab.reference.inputs.random_qkv(1, 8, 8, 4, 2, 8, "float32", seed=1)
    out = attnlab.attention(q[0], k[0], v[0], scale=0.3)
    assert out.shape == (8, 4, 8)
    assert check_close(out, q[0], k[0], v[0], scale=0.3).ok


def test_broadcast_bias_and_mask_shapes():
    q, k, v = attnlab.reference.inputs.random_qkv(2, 8, 12, 4, 2, 8, "float32", seed=2)
    rng = np.random.default_rng(0)
    bias = jax.numpy.asarray(rng.standard_normal((1, 4, 1, 12)), "float32")
    mask = jax.numpy.asarray(rng.random((12,)) < 0.7).at[0].set(True)
    for impl in ("naive", "xla"):
        out = attnlab.attention(q, k, v, bias, mask, implementation=impl)
        assert check_close(out, q, k, v, bias, mask).ok


def test_auto_matches_jax_nn_on_cpu():
    q, k, v = attnlab.reference.inputs.random_qkv(2, 16, 16, 4, 2, 16, "float32")
    a = attnlab.attention(q, k, v, is_causal=True)
    b = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_nan_never_passes():
    q, k, v = attnlab.reference.inputs.random_qkv(1, 4, 4, 2, 2, 8, "float32")
    out = np.asarray(attnlab.attention(q, k, v)).copy()
    out[0, 0, 0, 0] = np.nan
    assert not check_close(out, q, k, v).ok


def test_reference_is_not_fooled_by_a_wrong_path():
    q, k, v = attnlab.reference.inputs.random_qkv(1, 8, 8, 2, 2, 8, "float32")
    wrong = attnlab.attention(q, k, v)            # non-causal
    assert not check_close(wrong, q, k, v, is_causal=True).ok


def test_query_padding_rows_are_zero():
    q, k, v, kw = cases.build("padding", dtype="float32", seed=5)
    for impl in ("naive", "xla"):
        out = np.asarray(attnlab.attention(q, k, v, implementation=impl, **kw))
        ql = np.asarray(kw["query_seq_lengths"])
        for b in range(out.shape[0]):
            assert np.all(out[b, ql[b]:] == 0)


def test_reference_matches_textbook_formula():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 5, 1, 4)) for _ in range(3))
    s = q[0, :, 0] @ k[0, :, 0].T / 2.0
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(reference_attention(q, k, v)[0, :, 0], p @ v[0, :, 0], rtol=1e-12)


def test_fully_masked_rows_are_zero_in_naive_and_jax_nns_mean_of_v_in_the_reference():
    q, k, v = attnlab.reference.inputs.random_qkv(1, 4, 4, 2, 2, 8, "float32")
    kv = jax.numpy.asarray([0], jax.numpy.int32)
    ref = reference_attention(q, k, v, key_value_seq_lengths=kv)
    np.testing.assert_allclose(ref, np.broadcast_to(np.asarray(v, np.float64).mean(axis=1, keepdims=True), ref.shape))
    naive = attnlab.attention(q, k, v, key_value_seq_lengths=kv, implementation="naive")
    assert np.all(np.asarray(naive) == 0)
    assert check_close(naive, q, k, v, key_value_seq_lengths=kv).note == "4 rows see no key: compared as zeros"
