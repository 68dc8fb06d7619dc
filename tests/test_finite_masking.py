"""Masked logits stay finite, as jax.nn keeps them: every CPU path under ``jax.debug_infs(True)``.

jax.nn writes masked logits as a large negative capped at float32's range (``-0.7 * finfo.max``),
never ``-inf``; attnlab's own paths do the same, so a masked, causal or windowed call (and its
gradient) never produces an Inf anywhere, and rows that see no key give 0 (naive) or a finite
row (xla). float64 cases run inside ``jax.enable_x64(True)``, which does not leak into other tests.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from _dtypes import dtype_context, skip_xla_float64
from attnlab.reference import cases
from attnlab.reference.float64 import check_close

MODES = ("causal", "custom", "padding", "window", "causal+window", "custom+padding", "bias+window+padding")
DTYPES = ("float32", "bfloat16", "float64")




def _finite(tree):
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(tree))


def _loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) ** 2)




@pytest.mark.parametrize("impl", ["naive", "xla", None])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_masked_attention_and_grads_stay_finite_eagerly(impl, dtype, mode):
    skip_xla_float64(impl, dtype)
    with dtype_context(dtype):
        q, k, v, kw = cases.build(mode, batch=2, q_len=8, kv_len=12, heads=2, kv_heads=1, head_dim=8, dtype=dtype, seed=5)
        assert q.dtype == np.dtype(dtype)
        fn = lambda q, k, v: attnlab.attention(q, k, v, implementation=impl, **kw)  # noqa: E731
        with jax.debug_infs(True):
            out = fn(q, k, v)
            grads = jax.grad(_loss(fn), argnums=(0, 1, 2))(q, k, v)
        assert out.dtype == q.dtype and _finite(out) and _finite(grads)
        verdict = check_close(out, q, k, v, **kw)
        # jax.nn computes the softmax in float32 even for float64 inputs: float32-accurate there
        assert verdict.ok or (dtype == "float64" and impl != "naive" and verdict.rel_err < 1e-6), verdict


@pytest.mark.parametrize("impl", ["naive", "xla"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_attention_stays_finite_under_jit(impl, dtype):
    skip_xla_float64(impl, dtype)
    with dtype_context(dtype):
        q, k, v, kw = cases.build("causal+window", batch=1, q_len=8, kv_len=8, heads=2, kv_heads=2, head_dim=8,
                                  dtype=dtype, seed=2)
        fn = jax.jit(lambda q, k, v: attnlab.attention(q, k, v, implementation=impl, **kw))
        with jax.debug_infs(True):
            out = fn(q, k, v)
            grads = jax.jit(jax.grad(_loss(fn), argnums=(0, 1, 2)))(q, k, v)
        assert _finite(out) and _finite(grads)


@pytest.mark.parametrize("impl", ["naive", "xla"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_that_see_no_key_stay_finite(impl, dtype):
    skip_xla_float64(impl, dtype)
    with dtype_context(dtype):
        q, k, v = attnlab.reference.inputs.random_qkv(1, 4, 6, 2, 2, 8, dtype, seed=4)
        mask = np.ones((1, 1, 4, 6), bool)
        mask[..., 1, :] = False                       # query row 1 sees nothing
        fn = lambda q, k, v: attnlab.attention(q, k, v, mask=jnp.asarray(mask), implementation=impl)  # noqa: E731
        with jax.debug_infs(True):
            out = fn(q, k, v)
            grads = jax.grad(_loss(fn), argnums=(0, 1, 2))(q, k, v)
        assert _finite(out) and _finite(grads)
        if impl == "naive":                           # documented: naive (and the reference) give 0
            assert not np.any(np.asarray(out[0, 1], np.float32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("impl", ["attnlab-decode", "naive", "xla"])
def test_decode_attention_stays_finite(impl, dtype):
    skip_xla_float64(impl, dtype)
    q, k, v = attnlab.reference.inputs.random_qkv(3, 2, 40, 4, 2, 16, dtype, seed=6)
    lengths = jnp.asarray([2, 17, 40], jnp.int32)     # ragged; the kernel's empty splits: test below
    with jax.debug_infs(True):
        out = attnlab.decode_attention(q, k, v, lengths, causal=True, implementation=impl)
    assert _finite(out)
    ref = attnlab.reference_decode_attention(q, k, v, np.asarray(lengths), causal=True)
    assert float(attnlab.rel_l2(out, ref)) < (1e-5 if dtype == "float32" else 3e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ring_attention_stays_finite(dtype):
    with dtype_context(dtype):
        q, k, v = attnlab.reference.inputs.random_qkv(1, 16, 16, 2, 1, 8, dtype, seed=7)
        mesh = attnlab.make_mesh(1)
        with jax.debug_infs(True):
            out = attnlab.sharded_attention(q, k, v, mesh=mesh, strategy="ring", is_causal=True)
        assert _finite(out)
        verdict = check_close(out, q, k, v, is_causal=True)
        # ring blocks compute in float32 (documented in attnlab.api.sharded): float32-accurate for float64
        assert verdict.ok or (dtype == "float64" and verdict.rel_err < 1e-6), verdict


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_kernel_with_empty_splits_stays_finite(dtype):
    from attnlab.kernels import decode as kd

    q, k, v = attnlab.reference.inputs.random_qkv(2, 2, 256, 4, 2, 16, dtype, seed=9)
    lengths = jnp.asarray([3, 256], jnp.int32)        # batch 0: 1 of 8 blocks, 3 of 4 splits empty
    cfg = kd.DecodeConfig(block_k=32, num_splits=4)
    with jax.debug_infs(True):
        out = kd.decode_attention_pallas(q, k, v, lengths, causal=True, config=cfg, interpret=True)
    assert _finite(out)
    ref = attnlab.reference_decode_attention(q, k, v, np.asarray(lengths), causal=True)
    assert float(attnlab.rel_l2(out, ref)) < (1e-5 if dtype == "float32" else 3e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_device_reference_stays_finite(dtype):
    from attnlab.reference import blockwise as rd

    with dtype_context(dtype):
        q, k, v = attnlab.reference.inputs.random_qkv(2, 8, 12, 2, 1, 8, dtype, seed=10)
        ct = jnp.ones(q.shape, q.dtype)
        lens = jnp.asarray([5, 12], jnp.int32)
        with jax.debug_infs(True):
            for emulate in (False, True):
                out = rd.blockwise_attention(q, k, v, causal=True, window=(3, 0), kv_lengths=lens, emulate=emulate, tile=4)
                grads = rd.blockwise_grads(q, k, v, ct, causal=True, window=(3, 0), kv_lengths=lens, emulate=emulate, tile=4)
                assert _finite(out) and _finite(grads)
