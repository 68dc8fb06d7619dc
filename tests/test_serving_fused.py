"""The serving kernel with its merge fused into the pieces kernel (``ServingConfig(merge="fused")``, Pallas
interpret mode): one launch per class, every feature against float64, and the ticket logic with the pieces run in
another order (interpret mode runs programs one after another, so the order is the test's to choose)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import attnlab
from attnlab.core import kv_quant as kq
from attnlab.kernels import serving as ks
from attnlab.kernels import serving_plan as sp
from attnlab.kernels.pages import gather_pages, to_pages
from attnlab.reference.serving64 import reference_serving_attention
from attnlab.reference.tolerance import rel_l2, tolerance

N, K, H = 8, 2, 16
SINKS = np.array([2.0, -1.0, 0.5, 3.0, -np.inf, 1.0, 0.0, 4.0], np.float32)


def unit_pieces(cp):
    units = np.asarray(cp.units)
    return units[:, 4] - units[:, 3]


def test_plan_carries_the_merge_and_each_pieces_unit():
    starts, kv = np.array([0, 1, 7, 8], np.int32), np.array([150, 40, 9], np.int32)
    kw = dict(total_tokens=10, kv_len_max=160, heads=N, kv_heads=K, head_dim=H)
    plan = sp.make_serving_plan(starts, kv, **kw, config=sp.ServingConfig(block_k=16, decode_max_q=4, programs=4))
    assert plan.merge == "fused"      # the default (results/gpu-2026-12-05d-h100-merge-direct)
    assert sp.make_serving_plan(starts, kv, **kw, config=sp.ServingConfig(merge="kernel")).merge == "kernel"
    for cp in plan.classes:
        units, owners, st = np.asarray(cp.units), np.asarray(cp.piece_units), np.asarray(cp.starts)
        for j in range(st[0], st[-1]):                # every piece in a run lies in its unit's range
            assert units[owners[j], 3] <= j < units[owners[j], 4]
    with pytest.raises(ValueError, match="ServingConfig.merge must be 'kernel' or 'fused', got 'inline'"):
        sp.make_serving_plan(starts, kv, **kw, config=sp.ServingConfig(merge="inline"))


def test_fused_merge_composes_every_feature_in_one_launch_per_class():
    """A mixed batch under jit (lengths traced): a prefill class (a 12-token request, 3 tiles of 16 rows) and a decode
    class, a long request merging 4 pieces and short ones storing their rows alone, in both classes; paged int8 cache
    (pages of 8 < block_k 16), a sliding window, sinks, soft cap, a padding token: against float64, and the step is
    two launches (one per class) where the merge kernel makes it four."""
    q_len, kv = np.array([1, 12, 3, 1], np.int32), np.array([150, 40, 3, 9], np.int32)
    S, left, cap = 160, 100, 2.5
    starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    rng = np.random.default_rng(5)
    q = rng.standard_normal((int(starts[-1]) + 1, N, H)).astype(np.float32)
    k, v = (rng.standard_normal((len(kv), S, K, H)).astype(np.float32) for _ in range(2))
    kp, vp, table = to_pages(k, v, 8)
    (kc, ksc), (vc, vsc) = (attnlab.quantize_kv_cache(x, "int8", "token") for x in (kp, vp))
    k64, v64 = (gather_pages(kq.dequantize(np.asarray(c), np.asarray(s), "token", "float64"), np.asarray(table))
                for c, s in ((kc, ksc), (vc, vsc)))
    every = dict(logits_soft_cap=cap, sinks=SINKS, local_window_size=left)
    ref = reference_serving_attention(q, k64, v64, starts, kv, **every)
    cfg = sp.ServingConfig(block_k=16, decode_max_q=4, programs=3, block_r_prefill=16, merge="fused")
    mk = dict(total_tokens=q.shape[0], kv_len_max=S, heads=N, kv_heads=K, head_dim=H, dtype="float32", config=cfg,
              local_window_size=left, page_size=8)

    def step(q, kc, ksc, vc, vsc, table, a, b):
        plan = attnlab.serving_plan(a, b, **mk)
        return attnlab.serving_attention(q, kc, vc, a, b, page_table=table, k_scale=ksc, v_scale=vsc, plan=plan,
                                         implementation="attnlab-decode", **every)

    traced = jax.jit(step).trace(q, kc, ksc, vc, vsc, table, jnp.asarray(starts), jnp.asarray(kv))
    out = np.asarray(traced.lower().compile()(q, kc, ksc, vc, vsc, table, jnp.asarray(starts), jnp.asarray(kv)),
                     np.float64)
    limit, rule = tolerance(np.dtype("float32"))
    assert rel_l2(out, ref) <= limit, (rel_l2(out, ref), rule)
    assert not np.any(out[-1]), "the padding token gives 0"
    plan = attnlab.serving_plan(starts, kv, **mk)
    assert [cp.decode for cp in plan.classes] == [True, False]
    for cp in plan.classes:                           # both paths in both classes: a unit alone, a unit merged
        assert 1 in unit_pieces(cp) and max(unit_pieces(cp)) >= 2, unit_pieces(cp)
    assert sum(e.primitive.name == "pallas_call" for e in traced.jaxpr.eqns) == 2


class ProgramsReversed:
    """``jax.experimental.pallas`` for the pieces kernel, but program p along the grid's first axis (interpret
    mode: run p-th) takes the run of program P-1-p: the runs run last to first, each piece of a run still in order."""

    def __getattr__(self, name):
        return getattr(pl, name)

    @staticmethod
    def program_id(axis):
        return pl.num_programs(0) - 1 - pl.program_id(0) if axis == 0 else pl.program_id(axis)


def test_last_ticket_merges_whichever_piece_draws_it(monkeypatch):
    """One long request in 5 pieces over 7 programs (one-long, G=4), short ones alone, the programs run last to
    first: the unit's FIRST piece draws the last ticket and merges (the plan's order: its last piece, as in
    test_fused_merge_composes_...); against float64; a second call of the jitted step (its counters start at 0
    again) gives the same output."""
    monkeypatch.setattr(ks, "pl", ProgramsReversed())
    q_len, kv = np.ones(4, np.int32), np.array([160, 5, 9, 2], np.int32)
    starts = np.arange(5, dtype=np.int32)
    rng = np.random.default_rng(1)
    q = rng.standard_normal((6, N, H)).astype(np.float32)
    k, v = (rng.standard_normal((4, 160, K, H)).astype(np.float32) for _ in range(2))
    plan = sp.make_serving_plan(starts, kv, total_tokens=6, kv_len_max=160, heads=N, kv_heads=K, head_dim=H,
                                config=sp.ServingConfig(block_k=16, programs=7, max_q_len=1, merge="fused"))
    (cp,) = plan.classes
    assert sorted(unit_pieces(cp)[unit_pieces(cp) > 0]) == [1, 1, 1, 5]
    step = jax.jit(lambda q, k, v: ks.serving_attention_pallas(q, k, v, None, None, plan=plan, sinks=SINKS))
    out = np.asarray(step(q, k, v), np.float64)
    ref = reference_serving_attention(q, k, v, starts, kv, sinks=SINKS)
    assert rel_l2(out, ref) <= tolerance(np.dtype("float32"))[0] and not np.any(out[4:])
    np.testing.assert_array_equal(np.asarray(step(q, k, v)), out.astype(np.float32))
