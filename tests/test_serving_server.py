"""What a server's jitted step asks of serving_attention: idle slots of a fixed batch, host plans that keep one
compile, NumPy pages closed over, and a plan that cannot cut the cache short."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab.core.problem import Problem
from attnlab.core.serving_cost import serving_bytes, serving_flops
from attnlab.kernels import serving_plan as sp
from attnlab.kernels.pages import to_pages
from attnlab.reference.serving64 import kernel_like_serving, reference_serving_attention, sampled
from attnlab.reference.tolerance import rel_l2, tolerance

N, K, H, S = 8, 2, 16, 64


def _step(q_len, kv, pad=4, seed=0):
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    q = rng.standard_normal((int(starts[-1]) + pad, N, H)).astype(np.float32)
    k, v = (rng.standard_normal((len(kv), S, K, H)).astype(np.float32) for _ in range(2))
    return q, k, v, starts, np.asarray(kv, np.int32)


def _plan(a, b, total, **kw):
    return attnlab.serving_plan(a, b, total_tokens=total, kv_len_max=S, heads=N, kv_heads=K, head_dim=H, **kw)


@pytest.mark.parametrize("impl", ["xla", "attnlab-decode"])
def test_an_idle_slot_has_no_rows_and_costs_nothing(impl):
    """q_len 0 (a fixed B with fewer live requests): its kv_length may be anything in [0, S_max]; the others' rows
    are right, eagerly and under jit, and the cost model counts no key of it."""
    q, k, v, starts, kv = _step([1, 0, 12, 0, 3], [20, 0, 30, 9, 64])
    ref = reference_serving_attention(q, k, v, starts, kv)
    eager = attnlab.serving_attention(q, k, v, starts, kv, implementation=impl,
                                      plan=_plan(starts, kv, q.shape[0], config=sp.ServingConfig(block_k=16)))
    jitted = jax.jit(lambda a, b: attnlab.serving_attention(q, k, v, a, b, implementation=impl, plan=_plan(
        a, b, q.shape[0], config=sp.ServingConfig(block_k=16))))(jnp.asarray(starts), jnp.asarray(kv))
    for out in (eager, jitted):
        assert rel_l2(np.asarray(out, np.float64), ref) <= tolerance(np.dtype(np.float32))[0]
        assert not np.any(np.asarray(out)[starts[-1]:])
    live = np.array([0, 2, 4])
    live_starts = np.concatenate([[0], np.cumsum(np.diff(starts)[live])])
    assert serving_bytes(starts, kv, N, K, H, 2) == serving_bytes(live_starts, kv[live], N, K, H, 2)
    assert serving_flops(starts, kv, N, H) == serving_flops(live_starts, kv[live], N, H)
    assert {r for r, *_ in sampled(np.diff(starts), kv)} <= {0, 2, 4}
    assert rel_l2(kernel_like_serving(q, k, v, starts, kv, "float32"), ref) < 1e-5     # the check's emulation
    paged = dict(kv_dtype="float8_e4m3fn", kv_scale="page", page_size=16)
    idle, only = (dataclasses.replace(Problem.serving(ql, kl, N, K, H), **paged) for ql, kl in
                  ((np.diff(starts), kv), (np.diff(live_starts), kv[live])))
    assert idle.scale_bytes() == only.scale_bytes() and idle.kv_bytes() == only.kv_bytes()
    with pytest.raises(ValueError, match=r"q_starts must not decrease: request 1 has q_starts\[2\] - q_starts\[1\] = -1"):
        attnlab.serving_attention(q, k, v, np.array([0, 2, 1, 13, 13, 16], np.int32), kv)


def test_host_plans_with_a_bound_keep_one_compile():
    """A server planning on the host: with ServingConfig.max_q_len every step's plan has the sizes of a traced one
    (a decode-only step, a chunk of 12, one of 30), so the jitted step compiles once."""
    cfg = sp.ServingConfig(max_q_len=40, block_k=16)
    step = jax.jit(lambda q, k, v, a, b, p: attnlab.serving_attention(q, k, v, a, b, plan=p,
                                                                      implementation="xla"))
    shapes = set()
    for q_len in ([1, 1, 1, 1], [1, 12, 1, 1], [1, 30, 1, 1]):
        q, k, v, starts, kv = _step(q_len, [40, 50, 33, 64], pad=40 - sum(q_len))
        plan = _plan(starts, kv, 40, config=cfg)
        shapes.add(str(jax.tree_util.tree_structure(plan)) + str([np.shape(x) for x in jax.tree_util.tree_leaves(plan)]))
        traced = jax.eval_shape(lambda a, b: _plan(a, b, 40, config=cfg), starts, kv)
        assert jax.tree_util.tree_structure(traced) == jax.tree_util.tree_structure(plan)
        out = step(q, k, v, starts, kv, plan)
        assert rel_l2(np.asarray(out, np.float64), reference_serving_attention(q, k, v, starts, kv)) < 1e-5
    assert len(shapes) == 1 and step._cache_size() == 1


def test_numpy_pages_closed_over_a_jitted_step_run_on_the_xla_path():
    """to_pages of NumPy arrays gives NumPy pages; closed over by a step with traced lengths they are gathered with
    jax.numpy (serving and decode alike)."""
    q, k, v, starts, kv = _step([1, 1, 1], [20, 64, 5], pad=0)
    kp, vp, table = to_pages(k, v, 16)
    out = jax.jit(lambda a, b: attnlab.serving_attention(q, kp, vp, a, b, page_table=table, implementation="xla"))(
        jnp.asarray(starts), jnp.asarray(kv))
    assert rel_l2(np.asarray(out, np.float64), reference_serving_attention(q, k, v, starts, kv)) < 1e-5
    dec = jax.jit(lambda b: attnlab.decode_attention(q.reshape(3, 1, N, H), kp, vp, b, page_table=table,
                                                     implementation="xla"))(jnp.asarray(kv))
    np.testing.assert_allclose(np.asarray(dec).reshape(3, N, H), np.asarray(out), rtol=1e-5, atol=1e-6)


def test_a_plan_for_a_shorter_cache_is_refused():
    """The plan clamps every length to its kv_len_max: one below the cache's S_max would leave keys out without
    a word (the wrong answer passed every check before)."""
    q, k, v, starts, kv = _step([1, 3], [60, 40])
    short = attnlab.serving_plan(starts, kv, total_tokens=q.shape[0], kv_len_max=32, heads=N, kv_heads=K, head_dim=H)
    with pytest.raises(ValueError, match=r"plan was made for kv_len_max=32, below this call's S_max=64"):
        attnlab.serving_attention(q, k, v, starts, kv, plan=short, implementation="attnlab-decode")
    roomy = attnlab.serving_plan(starts, kv, total_tokens=q.shape[0], kv_len_max=128, heads=N, kv_heads=K, head_dim=H)
    out = attnlab.serving_attention(q, k, v, starts, kv, plan=roomy, implementation="attnlab-decode")
    assert rel_l2(np.asarray(out, np.float64), reference_serving_attention(q, k, v, starts, kv)) < 1e-5
