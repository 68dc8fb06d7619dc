"""attnlab's serving kernel with its merge fused (``ServingConfig(merge="fused")``) compiled by Triton on an NVIDIA
GPU: against float64 (ragged, mixed, paged, sinks, a window, soft cap), and its tickets under contention (every
program resident at once: a unit's pieces finish near together; a merge that read a partial before its stores
landed would give a different output some call).

    PYTHONPATH=src python -m pytest -q -m gpu tests/gpu/test_serving_fused_gpu.py
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab.core.request_lengths import draw
from attnlab.kernels.serving_plan import ServingConfig
from attnlab.reference.decode64 import check_decode_close

from test_serving_gpu import H, S, _need, batch, check_rows   # the serving kernel's GPU cases and checks

pytestmark = pytest.mark.gpu


def _step(T, N, K, q_len, merge, s_max=S, **kw):
    def step(q, k, v, a, b, t):
        plan = attnlab.serving_plan(a, b, total_tokens=T, kv_len_max=s_max, heads=N, kv_heads=K, head_dim=H,
                                    local_window_size=kw.get("local_window_size"), page_size=None if t is None else
                                    int(k.shape[1]), config=ServingConfig(max_q_len=int(max(q_len)), merge=merge))
        return attnlab.serving_attention(q, k, v, a, b, page_table=t, implementation="attnlab-decode", plan=plan, **kw)
    return jax.jit(step)


@pytest.mark.parametrize("case,heads,page,extra", [     # 7 cases: ~20 s on the H200
    ("ragged-decode", (32, 8), None, {}), ("ragged-decode", (56, 8), 16, {"sinks": True}),
    ("speculative", (32, 8), 64, {"logits_soft_cap": 30.0}), ("speculative", (8, 8), None, {"sinks": True}),
    ("mixed", (32, 8), None, {"sinks": True, "logits_soft_cap": 30.0}), ("mixed", (56, 8), 16, {}),
    ("mixed", (32, 8), None, {"local_window_size": 700}),
])
def test_fused_merge_matches_float64(case, heads, page, extra):
    _need()
    N, K = heads
    (q_len, kv, starts), (q, k, v), (kc, vc, table) = batch(case, N, K, page)
    T = q.shape[0]
    kw = dict(extra)
    if kw.pop("sinks", False):
        kw["sinks"] = jnp.linspace(-2.0, 3.0, N, dtype=jnp.float32)
    out = _step(T, N, K, q_len, "fused", **kw)(q, kc, vc, jnp.asarray(starts), jnp.asarray(kv), table)
    judge = {x: kw[x] for x in ("sinks", "logits_soft_cap") if x in kw}
    if "local_window_size" in kw:
        judge["local_window_size"] = (kw["local_window_size"], 0)
    check_rows(out, q, k, v, starts, kv, **{x: (np.asarray(y) if x == "sinks" else y) for x, y in judge.items()})


@pytest.mark.parametrize("dist", ["one-long", "lognormal"])
def test_fused_merge_tickets_hold_under_contention(dist):
    """B=32 at S=32768, G=4, T=1 (the benchmark's batch): 30 calls give one output bit for bit, within the
    tolerance of the merge kernel's, and the longest request's row is float64's."""
    _need()
    B, N, K, s_max = 32, 32, 8, 32768
    kv = draw(dist, B, 1, s_max, np.random.default_rng(7))
    q_len, starts = np.ones(B, np.int32), np.arange(B + 1, dtype=np.int32)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(3), 3)
    q = jax.random.normal(k1, (B, N, H), jnp.bfloat16)
    k = jax.random.normal(k2, (B, s_max, K, H), jnp.bfloat16)
    v = jax.random.normal(k3, (B, s_max, K, H), jnp.bfloat16)
    args = (q, k, v, jnp.asarray(starts), jnp.asarray(kv), None)
    fused, kernel = (_step(B, N, K, q_len, m, s_max=s_max) for m in ("fused", "kernel"))
    first = np.asarray(fused(*args), np.float32)
    for _ in range(30):
        np.testing.assert_array_equal(np.asarray(fused(*args), np.float32), first)
    ref = np.asarray(kernel(*args), np.float32)
    assert np.abs(first - ref).max() <= 2e-2 * np.abs(ref).max()
    b = int(np.argmax(kv))
    verdict = check_decode_close(np.asarray(first[b:b + 1])[None].astype(jnp.bfloat16), np.asarray(q[b:b + 1])[None],
                                 np.asarray(k[b:b + 1, :kv[b]]), np.asarray(v[b:b + 1, :kv[b]]), [int(kv[b])])
    assert verdict.ok, verdict
