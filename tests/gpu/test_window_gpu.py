"""Sliding windows in attnlab's decode and serving kernels compiled by Triton on an NVIDIA GPU, against float64.

    python -m pytest -q -m gpu tests/gpu/test_window_gpu.py

Every cache is poisoned with NaN before the window (every key before it; pages of >= block_k keys: every block
before its block): a kernel that loaded one would give NaN (0 * NaN in P.V), so each case also checks that the
window's keys are all that is read.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab import backends
from attnlab.kernels import decode as kd
from attnlab.kernels.pages import to_pages
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.inputs import random_qkv
from attnlab.reference.serving64 import reference_serving_attention
from attnlab.reference.tolerance import rel_l2

pytestmark = pytest.mark.gpu
S = 2048


def _need():
    why = backends.get("attnlab-decode").available()
    if why or jax.default_backend() != "gpu":
        pytest.skip(f"attnlab-decode on a GPU: {why or 'no GPU'}")


def _poison(x, firsts):
    before = (jnp.arange(x.shape[1])[None, :] < jnp.asarray(firsts)[:, None])[:, :, None, None]
    return jnp.where(before, jnp.nan, x)


@pytest.mark.parametrize("W", [128, 1000, 4096])                       # < S, not a block multiple, > S
@pytest.mark.parametrize("T,heads", [(1, (64, 8)), (4, (32, 8)), (16, (56, 8))], ids=["T1-G8", "T4-G4", "T16-G7"])
@pytest.mark.parametrize("page", [None, 16, 64], ids=["contig", "paged16", "paged64"])
def test_decode_kernel_matches_float64_and_reads_only_the_window(W, T, heads, page):
    _need()
    N, K = heads
    H = 64 if N == 64 else 128
    q, k, v = random_qkv(4, T, S, N, K, H, "bfloat16", seed=W + T)
    lengths = [S, T, S // 2 + 3, 777]                                  # ragged: full, exactly T, odd lengths
    # every key before the window is skipped; with pages of >= block_k keys (decode_plan.default_block_k for this
    # H) every block before the window's (``decode.window_base``)
    bk = kd.default_block_k(H)
    firsts = [kd.window_start(n, T, (W, 0)) // (bk if page and page >= bk else 1) * (bk if page and page >= bk else 1)
              for n in lengths]
    kp, vp, table = _poison(k, firsts), _poison(v, firsts), None
    if page:
        kp, vp, table = to_pages(kp, vp, page)
    f = jax.jit(functools.partial(attnlab.decode_attention, implementation="attnlab-decode", local_window_size=(W, 0),
                                  logits_soft_cap=30.0 if T == 4 else None))
    out = f(q, kp, vp, jnp.asarray(lengths, jnp.int32), page_table=table)
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    verdict = check_decode_close(out, q, k, v, lengths, local_window_size=(W, 0),
                                 logits_soft_cap=30.0 if T == 4 else None)
    assert verdict.ok, verdict


def test_windowed_rows_past_64_run_the_triton_kernel():
    """T*G = 128 rows would pick the Mosaic GPU kernel on Hopper; a window takes it only when asked (kernel="mosaic").
    By default the Triton one runs."""
    _need()
    q, k, v = random_qkv(2, 16, S, 64, 8, 128, "bfloat16", seed=3)
    lengths = [S, 900]
    f = jax.jit(functools.partial(attnlab.decode_attention, implementation="attnlab-decode", local_window_size=256))
    assert "mosaic_gpu" not in f.lower(q, k, v, jnp.asarray(lengths, jnp.int32)).as_text()
    out = f(q, k, v, jnp.asarray(lengths, jnp.int32))
    assert check_decode_close(out, q, k, v, lengths, local_window_size=256).ok


@pytest.mark.parametrize("page", [None, 16, 64], ids=["contig", "paged16", "paged64"])
@pytest.mark.parametrize("W", [128, 1500])
def test_serving_kernel_matches_float64_and_reads_only_the_window(page, W):
    """A mixed step: 2 prefill chunks of 300 and 30 ragged decodes, traced lengths, the plan made in jit (for the
    cache's pages). Every key before each request's window is NaN (pages of >= block_k = 64 keys: every block
    before its block, ``serving_plan``'s ``kv_start``)."""
    _need()
    N, K, H = 32, 8, 128
    rng = np.random.default_rng(W)
    q_len = np.array([300, 300] + [1] * 30, np.int32)
    kv = np.maximum(rng.integers(1, S + 1, q_len.size), q_len).astype(np.int32)
    kv[0] = S
    starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    q = jax.random.normal(jax.random.PRNGKey(1), (int(starts[-1]) + 16, N, H), jnp.bfloat16)
    k, v = (jax.random.normal(jax.random.PRNGKey(i), (q_len.size, S, K, H), jnp.bfloat16) for i in (2, 3))
    bk = kd.default_block_k(H)                                       # the plan's block_k for both classes
    step_block = bk if page and page >= bk else 1
    firsts = [(max(0, n - t - W) // step_block) * step_block for n, t in zip(kv, q_len)]
    kp, vp, table = _poison(k, firsts), _poison(v, firsts), None
    if page:
        kp, vp, table = to_pages(kp, vp, page)

    def step(q, k, v, a, b, t):
        plan = attnlab.serving_plan(a, b, total_tokens=q.shape[0], kv_len_max=S, heads=N, kv_heads=K, head_dim=H,
                                    local_window_size=W, page_size=page)
        return attnlab.serving_attention(q, k, v, a, b, page_table=t, plan=plan, local_window_size=W,
                                         implementation="attnlab-decode")

    out = np.asarray(jax.jit(step)(q, kp, vp, jnp.asarray(starts), jnp.asarray(kv), table), np.float64)
    assert np.all(np.isfinite(out))
    reqs = [0, 1, 2, int(np.argmin(kv))]
    ref = reference_serving_attention(np.asarray(q), np.asarray(k), np.asarray(v), starts, kv, requests=reqs,
                                      local_window_size=W)
    rows = np.concatenate([np.arange(starts[b], starts[b + 1]) for b in reqs])
    assert rel_l2(out[rows], ref[rows]) < 1e-2
