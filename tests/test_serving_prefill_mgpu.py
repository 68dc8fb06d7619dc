"""A serving step's prefill chunks on the Mosaic GPU kernel (``ServingConfig(prefill_slots=, prefill_chunk=)``, in
JAX's GPU interpreter on the CPU): which requests take a slot, and a mixed step against float64 with the rest of
the step on the Triton classes (interpret mode)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab.kernels import serving as ks
from attnlab.kernels import serving_plan as sp
from attnlab.kernels import serving_prefill_mgpu as prefill_mgpu
from attnlab.reference.serving64 import reference_serving_attention
from attnlab.reference.tolerance import rel_l2


def test_the_first_slots_take_the_prefill_requests_that_fit_the_chunk():
    """Requests of q_len in (decode_max_q, chunk] in request order, as many as there are slots; the prefill class
    keeps the others (a chunk too long, one past the last slot), the decode class its own; traced or not."""
    q_len = np.array([1, 20, 40, 17, 30, 2], np.int32)
    kv = np.array([50, 64, 100, 90, 30, 9], np.int32)
    starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    cfg = sp.ServingConfig(decode_max_q=16, prefill_slots=2, prefill_chunk=32)
    kw = dict(total_tokens=int(starts[-1]), kv_len_max=128, heads=4, kv_heads=2, head_dim=64, config=cfg)
    plan = sp.make_serving_plan(starts, kv, **kw)
    want = [[1, 1, 20, 64], [3, 61, 17, 90]]          # request, q_start, q_len, kv_len
    assert np.asarray(plan.prefill.slots).tolist() == want and plan.prefill.chunk == 32
    traced = jax.jit(lambda a, b: sp.make_serving_plan(a, b, **kw))(jnp.asarray(starts), jnp.asarray(kv))
    assert np.asarray(traced.prefill.slots).tolist() == want
    prefill = [cp for cp in plan.classes if not cp.decode][0]
    assert sorted(set(np.asarray(prefill.pieces)[np.asarray(prefill.pieces)[:, -1] > 0, 0])) == [2, 4]
    few = sp.make_serving_plan(starts[:2], kv[:1], **{**kw, "total_tokens": 1})
    assert few.prefill is None                        # no request can prefill: no slots
    empty = jax.jit(lambda a, b: sp.make_serving_plan(a, b, **{**kw, "total_tokens": 20}))(
        jnp.array([0, 1, 3], jnp.int32), jnp.array([5, 9], jnp.int32))
    assert np.asarray(empty.prefill.slots).tolist() == [[2, 0, 0, 0]] * 2      # request B: an empty slot
    with pytest.raises(ValueError, match="prefill_chunk must be an int > decode_max_q=16"):
        sp.make_serving_plan(starts, kv, **{**kw, "config": sp.ServingConfig(prefill_slots=1)})
    for alone in (dict(prefill_chunk=32), dict(prefill_stream=1)):     # they did nothing without a word
        with pytest.raises(ValueError, match="do nothing without prefill_slots > 0"):
            sp.make_serving_plan(starts, kv, **{**kw, "config": sp.ServingConfig(**alone)})


def test_slots_on_their_own_stream_lower_as_an_annotated_call():
    """``ServingConfig(prefill_stream=n)`` reaches the plan's slots, and ``on_stream`` lowers its function as a call
    XLA runs on CUDA stream n (the step on the H200: tests/gpu/test_serving_prefill_mgpu_gpu.py); n < 0 is refused."""
    starts, kv = np.array([0, 1, 21], np.int32), np.array([50, 64], np.int32)
    kw = dict(total_tokens=21, kv_len_max=128, heads=4, kv_heads=2, head_dim=64)
    cfg = sp.ServingConfig(prefill_slots=1, prefill_chunk=32, prefill_stream=2)
    assert sp.make_serving_plan(starts, kv, config=cfg, **kw).prefill.stream == 2
    with pytest.raises(ValueError, match="prefill_stream must be an int >= 0, got -1"):
        sp.make_serving_plan(starts, kv, config=sp.ServingConfig(prefill_slots=1, prefill_chunk=32,
                                                                 prefill_stream=-1), **kw)
    step = jax.jit(lambda x: prefill_mgpu.on_stream(lambda y: y * 2, 2)(x) + 1)
    x = jnp.arange(4.0)
    assert '_xla_stream_annotation = "2"' in step.lower(x).as_text()
    assert np.asarray(step(x)).tolist() == [1.0, 3.0, 5.0, 7.0]


def test_mixed_step_with_mosaic_prefill_matches_float64():
    """Two prefill chunks in the slots (one shorter than the chunk: its slot's first rows are padding), one longer
    than the chunk on the Triton prefill class, two decodes and a padding token, with a window and sinks. G=8, so a
    slot is two row tiles; the cache NaN past every length (its pages view reads whole blocks; a paged cache's
    table: tests/gpu/test_serving_prefill_mgpu_gpu.py). Eager: JAX's GPU interpreter hangs under jit on the CPU,
    where the call raises (the traced plan is the concrete one: above)."""
    window, N, K, H, S = 24, 8, 1, 64, 128
    q_len, kv = np.array([1, 20, 40, 24, 1], np.int32), np.array([50, 100, 128, 24, 9], np.int32)
    starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((int(starts[-1]) + 1, N, H)).astype(np.float32)
    k, v = (rng.standard_normal((len(kv), S, K, H)).astype(np.float32) for _ in range(2))
    sk = np.linspace(-1.0, 2.0, N).astype(np.float32)
    ref = reference_serving_attention(q, k, v, starts, kv, sinks=sk, local_window_size=window)
    past = np.arange(S)[None, :, None, None] >= kv[:, None, None, None]
    k, v = np.where(past, np.nan, k), np.where(past, np.nan, v)
    qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    cfg = sp.ServingConfig(decode_max_q=4, prefill_slots=2, prefill_chunk=24, block_k=32)
    mk = dict(total_tokens=q.shape[0], kv_len_max=S, heads=N, kv_heads=K, head_dim=H, config=cfg,
              window_left=window)

    plan = sp.make_serving_plan(starts, kv, **mk)
    out = np.asarray(ks.serving_attention_pallas(qb, kb, vb, starts, kv, plan=plan, sinks=jnp.asarray(sk)), np.float32)
    with pytest.raises(NotImplementedError, match="hangs under jax.jit"):
        jax.jit(lambda q: ks.serving_attention_pallas(q, kb, vb, starts, kv, plan=plan))(qb)
    assert np.isfinite(out).all() and not out[starts[-1]:].any()
    for b in range(len(kv)):
        rows = slice(starts[b], starts[b + 1])
        assert rel_l2(out[rows], ref[rows]) < 2e-2, (b, rel_l2(out[rows], ref[rows]))


def test_refusals_name_the_config():
    q = jnp.zeros((30, 4, 64), jnp.bfloat16)
    k = jnp.zeros((2, 128, 2, 64), jnp.bfloat16)
    starts, kv = np.array([0, 20, 21], np.int32), np.array([60, 9], np.int32)
    cfg = sp.ServingConfig(decode_max_q=4, prefill_slots=1, prefill_chunk=24)
    plan = sp.make_serving_plan(starts, kv, total_tokens=30, kv_len_max=128, heads=4, kv_heads=2, head_dim=64,
                                config=cfg)
    with pytest.raises(ValueError, match=r"prefill_slots\): mosaic decode: soft cap"):
        ks.serving_attention_pallas(q, k, k, starts, kv, plan=plan, soft_cap=30.0)
    codes, scale = attnlab.quantize_kv_cache(k, "int8", "tensor")
    with pytest.raises(ValueError, match="quantized cache runs on the Triton prefill class"):
        ks.serving_attention_pallas(q, codes, codes, starts, kv, plan=plan, k_scale=scale, v_scale=scale,
                                    kv_scale="tensor")
