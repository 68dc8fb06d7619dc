"""The Mosaic GPU (wgmma) decode kernel on an NVIDIA Hopper GPU against float64: the plan running it for
T*G > 64 rows through ``attnlab.decode_attention``, and sliding windows when asked for (``kernel="mosaic"``).
K and V hold NaN at every key no row sees (past each length, before each window's first key, in the page that
-1 table slots read): the kernel loads whole blocks, so any of them left in a score or in P.V gives NaN.

    python -m pytest -q -m gpu tests/gpu/test_decode_mgpu_gpu.py
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab.core import device
from attnlab.kernels import decode as kd
from attnlab.kernels import decode_mgpu as dm
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.inputs import random_qkv

pytestmark = pytest.mark.gpu


def _need_hopper():
    cc = device.current().compute_capability
    if cc != (9, 0):
        pytest.skip(f"the Mosaic GPU decode kernel needs sm_90, device is {cc}")


def _nan_outside(x, starts, lengths):
    """x (B, S, K, H) with NaN at every key before starts[b] or from lengths[b] on."""
    pos = jnp.arange(x.shape[1])[None, :]
    bad = (pos < jnp.asarray(starts)[:, None]) | (pos >= jnp.asarray(lengths)[:, None])
    return jnp.where(bad[:, :, None, None], jnp.nan, x)


def _nan_paged(k, v, starts, lengths, page_size):
    """k, v NaN outside [starts, lengths) in pages, -1 in every table slot past a sequence's pages, and a NaN
    page 0 (the others shifted past it) that those slots read."""
    from attnlab.kernels import pages as kp

    kpg, vpg, table = kp.to_pages(_nan_outside(k, starts, lengths), _nan_outside(v, starts, lengths), page_size)
    table = np.asarray(table) + 1
    for b, n in enumerate(kp.pages_in_use(lengths, page_size)):
        table[b, n:] = -1
    nan = jnp.full((1,) + kpg.shape[1:], jnp.nan, kpg.dtype)
    return jnp.concatenate([nan, kpg]), jnp.concatenate([nan, vpg]), jnp.asarray(table)


@pytest.mark.parametrize("B, T, S, N, K, H, lengths, causal", [
    (4, 16, 4096, 28, 4, 128, [4096, 21, 2051, 77], True),     # G = 7: 112 rows, ragged
    (2, 8, 2048, 64, 4, 64, [2048, 1000], True),               # G = 16, H = 64
    (2, 13, 4096, 20, 4, 128, [4096, 130], False),             # G = 5, odd T: 65 rows, no causal rule
    (2, 64, 4032, 32, 8, 128, [4032, 64], True),               # S not a multiple of 128: 64-key steps
    (1, 32, 8192, 64, 4, 128, [8192], True),                   # 512 rows: four row tiles
])
def test_mosaic_kernel_matches_float64_through_decode_attention(B, T, S, N, K, H, lengths, causal):
    _need_hopper()
    assert dm.pick_kernel(T, S, N, K, H, "bfloat16", compute_capability=(9, 0)) == "mosaic"
    q, k, v = random_qkv(B, T, S, N, K, H, "bfloat16", seed=T)
    f = jax.jit(functools.partial(attnlab.decode_attention, implementation="attnlab-decode", causal=causal))
    n = jnp.asarray(lengths, jnp.int32)
    kq, vq = _nan_outside(k, [0] * B, lengths), _nan_outside(v, [0] * B, lengths)
    assert "mosaic_gpu" in f.lower(q, kq, vq, n).as_text()        # the plan ran the wgmma kernel
    out = f(q, kq, vq, n)
    verdict = check_decode_close(out, q, k, v, lengths, causal=causal)
    assert verdict.ok, verdict


@pytest.mark.parametrize("splits", [1, 3])
def test_mosaic_kernel_on_request_at_few_rows_and_float16(splits):
    _need_hopper()
    q, k, v = random_qkv(2, 2, 1024, 8, 8, 128, "float16", seed=splits)
    lengths = [1024, 300]
    plan = dm.make_mgpu_plan(2, 2, 1024, 8, 8, 128, num_splits=splits)
    kq, vq = _nan_outside(k, [0, 0], lengths), _nan_outside(v, [0, 0], lengths)
    out = dm.decode_attention_mgpu(q, kq, vq, jnp.asarray(lengths), plan=plan)
    verdict = check_decode_close(out, q, k, v, lengths)
    assert verdict.ok, verdict
    out2 = kd.decode_attention_pallas(q, kq, vq, jnp.asarray(lengths), config=kd.DecodeConfig(kernel="mosaic"))
    assert check_decode_close(out2, q, k, v, lengths).ok


@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
@pytest.mark.parametrize("T, N, K, H", [(16, 28, 4, 128), (8, 64, 4, 64)])
def test_mosaic_kernel_on_paged_caches(page_size, T, N, K, H):
    _need_hopper()
    S = 2048
    q, k, v = random_qkv(4, T, S, N, K, H, "bfloat16", seed=page_size)
    lengths = [S, 130, 1000, T]
    kpg, vpg, t = _nan_paged(k, v, [0] * 4, lengths, page_size)
    assert dm.pick_kernel(T, S, N, K, H, "bfloat16", compute_capability=(9, 0), page_size=page_size) == "mosaic"
    f = jax.jit(functools.partial(attnlab.decode_attention, implementation="attnlab-decode"))
    n = jnp.asarray(lengths, jnp.int32)
    assert "mosaic_gpu" in f.lower(q, kpg, vpg, n, page_table=t).as_text()
    out = f(q, kpg, vpg, n, page_table=t)
    verdict = check_decode_close(out, q, k, v, lengths)
    assert verdict.ok, verdict


@pytest.mark.parametrize("page", [None, 16, 128], ids=["contig", "paged16", "paged128"])
@pytest.mark.parametrize("T, N, K, H, causal, right", [(1, 64, 8, 64, True, 0), (16, 28, 4, 128, True, 0),
                                                       (13, 20, 4, 128, False, 3)],
                         ids=["T1-G8", "T16-G7", "T13-G5-nc"])
@pytest.mark.parametrize("W", [128, 1000, 4096])                       # < S, not a block multiple, > S
def test_mosaic_kernel_windowed_on_request_reads_only_the_window(W, T, N, K, H, causal, right, page):
    """``DecodeConfig(kernel="mosaic")`` with a window: the wgmma kernel, against float64; K and V are NaN before
    each window and past each length, so loading a block before the window's first one, leaving a key before a
    row's window unmasked, or a loaded value row outside the window gives NaN."""
    _need_hopper()
    S, window = 2048, (W, right)
    q, k, v = random_qkv(4, T, S, N, K, H, "bfloat16", seed=W + T)
    lengths = [S, T, S // 2 + 3, 777]                                  # ragged: full, exactly T, odd lengths
    starts = [kd.window_start(n, T, window) for n in lengths]
    if page:
        kq, vq, table = _nan_paged(k, v, starts, lengths, page)
    else:
        kq, vq, table = _nan_outside(k, starts, lengths), _nan_outside(v, starts, lengths), None
    f = jax.jit(lambda q, k, v, n, t: kd.decode_attention_pallas(
        q, k, v, n, causal=causal, page_table=t, window=window, config=kd.DecodeConfig(kernel="mosaic")))
    n = jnp.asarray(lengths, jnp.int32)
    assert "mosaic_gpu" in f.lower(q, kq, vq, n, table).as_text()
    out = f(q, kq, vq, n, table)
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    verdict = check_decode_close(out, q, k, v, lengths, causal=causal, local_window_size=window)
    assert verdict.ok, verdict
