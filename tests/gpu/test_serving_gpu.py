"""attnlab's serving kernel compiled by Triton on an NVIDIA GPU against float64: ragged, mixed, paged.

    PYTHONPATH=src python -m pytest -q -m gpu tests/gpu/test_serving_gpu.py
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab import backends
from attnlab.kernels.pages import to_pages
from attnlab.kernels.serving_plan import ServingConfig
from attnlab.reference.decode64 import check_decode_close

pytestmark = pytest.mark.gpu
S, H = 4096, 128
CASES = {   # (q_len per request, kv_len per request)
    "ragged-decode": ([1] * 6, [4096, 1, 77, 2049, 1000, 4095]),
    "speculative": ([4] * 5, [4, 4096, 129, 3000, 64]),
    "mixed": ([1, 300, 1, 64, 1, 5], [4096, 300, 17, 2000, 1, 4000]),
    "idle-slots": ([1, 0, 200, 0, 4], [4096, 0, 300, 77, 4000]),     # q_len 0: a fixed B's free slots
}


def _need():
    why = backends.get("attnlab-decode").available()
    if why:
        pytest.skip(why)


def batch(case, N, K, page):
    """One of ``CASES`` as a packed step of 5 padding tokens: (q_len, kv_len, starts) as int32, q (T, N, H) and the
    dense k, v (B, S, K, H) in bfloat16, and the cache the kernel reads: (k, v, None) or pages of ``page`` keys
    with their table."""
    q_len, kv = (np.array(x, np.int32) for x in CASES[case])
    starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    B, T = len(kv), int(starts[-1]) + 5
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(len(case) + N + (page or 0)), 3)
    q = jax.random.normal(k1, (T, N, H), jnp.bfloat16)
    k = jax.random.normal(k2, (B, S, K, H), jnp.bfloat16)
    v = jax.random.normal(k3, (B, S, K, H), jnp.bfloat16)
    cache = (k, v, None) if page is None else (*to_pages(k, v, page)[:2], jnp.asarray(to_pages(k, v, page)[2]))
    return (q_len, kv, starts), (q, k, v), cache


def check_rows(out, q, k, v, starts, kv, **rules):
    """Padding rows 0; every token of each request against float64 under ``rules`` (``check_decode_close``'s
    keywords), 16 tokens at a time: each run is the decode rule at T=t against the keys before its last token."""
    assert not np.any(np.asarray(out[int(starts[-1]):], np.float32)), "padding rows must be 0"
    for b in range(len(kv)):
        lo, hi, n = int(starts[b]), int(starts[b + 1]), int(kv[b])
        for first in range(lo, hi, 16):
            t = min(16, hi - first)
            keys = n - (hi - first - t)
            verdict = check_decode_close(np.asarray(out[first:first + t])[None], np.asarray(q[first:first + t])[None],
                                         np.asarray(k[b:b + 1, :keys]), np.asarray(v[b:b + 1, :keys]), [keys], **rules)
            assert verdict.ok, (b, first, verdict)


G4, G7, G1 = (32, 8), (56, 8), (8, 8)


@pytest.mark.parametrize("case,heads,page", [     # 24 cases: ~55 s on the H200
    *[(c, G4, p) for c in CASES for p in (None, 16, 64)],
    *[(c, G7, p) for c in CASES for p in (None, 16)],
    *[(c, G1, None) for c in CASES],
])
def test_serving_kernel_matches_float64(case, heads, page):
    _need()
    N, K = heads
    (q_len, kv, starts), (q, k, v), (kc, vc, table) = batch(case, N, K, page)
    T = q.shape[0]
    cap = 30.0 if case == "mixed" else None

    def step(q, k, v, a, b, t):
        plan = attnlab.serving_plan(a, b, total_tokens=T, kv_len_max=S, heads=N, kv_heads=K, head_dim=H,
                                    config=ServingConfig(max_q_len=int(q_len.max())))
        return attnlab.serving_attention(q, k, v, a, b, page_table=t, logits_soft_cap=cap,
                                         implementation="attnlab-decode", plan=plan)

    out = jax.jit(step)(q, kc, vc, jnp.asarray(starts), jnp.asarray(kv), table)
    check_rows(out, q, k, v, starts, kv, logits_soft_cap=cap)


def test_auto_runs_the_kernel_on_the_gpu():
    _need()
    q = jnp.zeros((8, 32, 128), jnp.bfloat16)
    k = jnp.zeros((2, 256, 8, 128), jnp.bfloat16)
    ex = attnlab.explain_serving(q, k, k, np.array([0, 1, 4], np.int32), np.array([10, 200], np.int32))
    assert ex.chosen == "attnlab-decode", str(ex)
