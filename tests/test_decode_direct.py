"""The decode kernel's one-split launch (``kernels.decode_direct``): O normalised in registers and stored in q's dtype
straight into (B, T, N, H), no partials and no combine; against float64 and against the partials + combine path."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab.core import kv_quant as kq
from attnlab.kernels import decode as kd
from attnlab.kernels.decode_splits import choose_num_splits
from attnlab.kernels.pages import gather_pages, to_pages
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.inputs import random_qkv
from attnlab.reference.tolerance import rel_l2

# B, T, S, N, K, H, dtype, lengths, causal, window, config, page size, soft cap, sinks, (cache dtype, scale layout)
CASES = {
    # gpt-oss's G = 8 at T = 1 (8 of 16 rows masked), a window shorter than one sequence, sinks
    "window-sinks-t1-g8": (2, 1, 64, 8, 1, 64, "bfloat16", [64, 20], True, (16, 0), dict(block_k=16), None, None,
                           True, None),
    # G = 3 (rows t * 3 + g scattered to (t, g)), pages of 8 under 16-key blocks (the per-key gather), sinks
    "paged8-sinks-t3-g3": (2, 3, 64, 6, 2, 32, "float16", [64, 17], True, None, dict(block_k=16), 8, None, True, None),
    # 32 rows in two row tiles of 16, an int8 cache with per-token scales, the soft cap
    "int8-token-cap-tiles": (2, 8, 32, 8, 2, 32, "bfloat16", [32, 9], True, None, dict(block_k=16, block_r=16), None,
                             3.0, False, ("int8", "token")),
    # an FP8 cache in pages of 16 with per-page scales, a two-sided window without causality, sinks
    "fp8-page16-window-sinks": (2, 2, 64, 4, 2, 16, "bfloat16", [64, 21], False, (10, 3), dict(block_k=16), 16,
                                None, True, ("fp8", "page")),
}


def run_case(name, **cfg):
    """(output, q, float64-ready k and v, lengths, check kwargs) of one CASES entry on the kernel (interpret mode)."""
    B, T, S, N, K, H, dtype, lengths, causal, window, config, page, cap, with_sinks, quant = CASES[name]
    q, k, v = random_qkv(B, T, S, N, K, H, dtype, seed=len(name))
    sinks = jnp.linspace(-1.0, 3.0, N, dtype=jnp.float32) if with_sinks else None
    table, kw = None, {}
    if page:
        k, v, table = to_pages(k, v, page)
    if quant:
        (k, ks), (v, vs) = (attnlab.quantize_kv_cache(x, quant[0], quant[1]) for x in (k, v))
        kw = dict(k_scale=ks, v_scale=vs, kv_scale=quant[1])
    out = kd.decode_attention_pallas(q, k, v, jnp.asarray(lengths), causal=causal, interpret=True, page_table=table,
                                     soft_cap=cap, window=window, sinks=sinks,
                                     config=kd.DecodeConfig(num_splits=1, **{**config, 'direct_output': True, **cfg}), **kw)
    k64, v64 = (kq.dequantize(np.asarray(c), np.asarray(kw[s]), quant[1], "float64") if quant else c
                for c, s in ((k, "k_scale"), (v, "v_scale")))
    if page:
        k64, v64 = (gather_pages(np.asarray(x), np.asarray(table)) for x in (k64, v64))
    return out, q, k64, v64, lengths, dict(causal=causal, logits_soft_cap=cap, sinks=sinks, local_window_size=window)


@pytest.mark.parametrize("case", list(CASES))
def test_one_split_stores_o_directly_and_matches_float64_and_the_combine(case):
    out, q, k64, v64, lengths, kw = run_case(case)
    assert out.shape == q.shape and out.dtype == q.dtype
    verdict = check_decode_close(out, q, k64, v64, lengths, **kw)
    assert verdict.ok, verdict
    if case == "window-sinks-t1-g8":     # the same math as partials + combine (once: each call costs seconds here)
        assert rel_l2(out, run_case(case, direct_output=False)[0]) <= 1e-3


def pallas_calls_and_combine_ops(config, sinks=None):
    """(pallas_call count, the combine's reductions and exp2s outside it) in the call's jaxpr, T = 2, one split."""
    q, k, v = random_qkv(2, 2, 32, 4, 2, 16, "bfloat16", seed=3)
    f = functools.partial(kd.decode_attention_pallas, config=config, interpret=True, sinks=sinks)
    eqns = jax.make_jaxpr(f)(q, k, v, jnp.array([32, 5])).jaxpr.eqns
    names = [e.primitive.name for e in eqns]
    return names.count("pallas_call"), [n for n in names if n in ("reduce_max", "reduce_sum", "exp2", "transpose")]


def test_a_one_split_call_is_one_kernel_with_no_combine():
    sinks = jnp.ones((4,), jnp.float32)
    assert pallas_calls_and_combine_ops(kd.DecodeConfig(num_splits=1, direct_output=True), sinks) == (1, [])
    calls, ops = pallas_calls_and_combine_ops(kd.DecodeConfig(num_splits=1, direct_output=False), sinks)
    assert calls == 1 and {"reduce_max", "reduce_sum", "exp2", "transpose"} <= set(ops)
    assert pallas_calls_and_combine_ops(kd.DecodeConfig(num_splits=2))[1]          # two splits: the combine


def test_the_plan_takes_one_split_where_the_waves_allow_and_the_switch_turns_it_off():
    h200 = dict(sms=132, compute_capability=(9, 0))
    for B, S, W in ((256, 32768, 128), (256, 8192, 1024)):   # gpt-oss's windowed decode: whole waves already
        plan = kd.make_plan(B, 1, S, 64, 8, 64, jnp.bfloat16, kd.DecodeConfig(direct_output=True), window=(W, 0),
                            **h200)
        assert plan.num_splits == 1 and plan.direct
    default = kd.make_plan(256, 1, 32768, 64, 8, 64, jnp.bfloat16, window=(128, 0), **h200)   # the default: on
    assert default.num_splits == 1 and default.direct
    off = kd.make_plan(256, 1, 32768, 64, 8, 64, jnp.bfloat16, kd.DecodeConfig(direct_output=False), window=(128, 0),
                       **h200)
    assert off.num_splits == 1 and not off.direct
    grid = kd.make_plan(8, 1, 32768, 32, 8, 128, jnp.bfloat16, kd.DecodeConfig(direct_output=True),
                        **h200)      # B*K = 64 programs: split to fill
    assert grid.num_splits > 1 and not grid.direct
    # 512 programs of 8 blocks on 396 slots: two splits are 10% fewer block-loads in the wave model, but one split
    # stored directly writes no partials and starts no combine
    kw = dict(rows=8, block_k=64, head_dim=128, sm_count=132, occupancy=3)
    assert choose_num_splits(512, 512, **kw) == 2 and choose_num_splits(512, 512, direct_output=True, **kw) == 1
