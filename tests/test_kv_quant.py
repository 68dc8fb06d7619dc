"""Quantized KV caches (FP8 e4m3/e5m2, int8 with float32 scales): the quantizer, the argument rules, the masked
paths, attnlab's decode and serving kernels (Pallas interpret mode) against float64, and the Triton lowering.
Kernel shapes stay tiny: interpret mode is slow."""
import functools
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import attnlab
from attnlab.core import kv_quant as kq
from attnlab.core.errors import UnsupportedError
from attnlab.kernels import decode as kd
from attnlab.kernels import serving_plan as sp
from attnlab.kernels.pages import gather_pages, to_pages
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.dequant64 import dequantized_sequences64
from attnlab.reference.inputs import random_qkv
from attnlab.reference.serving64 import reference_serving_attention
from attnlab.reference.tolerance import rel_l2


@pytest.mark.parametrize("layout,page_size", [("token", None), ("head", None), ("token", 4), ("page", 4),
                                               ("tensor", 4)])
def test_the_truths_dequantization_agrees_with_the_paths(layout, page_size):
    """The float64 truths' own reading (reference.dequant64) of some sequences of a quantized cache, a paged
    (shuffled) one's through its table, equals the paths' (kv_quant.dequantize) of the contiguous cache quantized the
    same way (each page a group of its own), dequantized whole: two writings of one rule agree."""
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 8, 2, 4)), jnp.float32)
    seqs = [2, 0]
    if page_size:
        kc, _, table = to_pages(x, x, page_size)
        contiguous = x.reshape(3 * 8 // page_size, page_size, 2, 4)     # pages in order: the same groups
    else:
        kc, table, contiguous = x, None, x
    c, s = kq.quantize_kv_cache(kc, "int8", layout)
    got = dequantized_sequences64(c, s, seqs, table)
    cw, sw = kq.quantize_kv_cache(contiguous, "int8", layout)
    want = kq.dequantize(np.asarray(cw), np.asarray(sw), layout, "float64").reshape(3, 8, 2, 4)[seqs]
    assert got.dtype == np.float64 and got.shape == (2, 8, 2, 4)
    np.testing.assert_array_equal(got, want)


def test_quantize_kv_cache_is_absmax_over_qmax_per_group():
    x = np.random.default_rng(0).standard_normal((2, 8, 2, 16)).astype(np.float32) * 3
    x[1, 3, 0] = 0.0                                           # an all-zero token: scale 1, stored 0
    xb = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32)
    cases = (("fp8", ml_dtypes.float8_e4m3fn, "token", (3,)), ("e5m2", ml_dtypes.float8_e5m2, "head", (0, 1, 3)),
             ("int8", np.int8, "page", (1, 3)), ("int8", np.int8, "tensor", (0, 1, 2, 3)))
    for dtype, np_dtype, gran, axes in cases:
        name = kq.canonical_kv_dtype(dtype)
        c, s = attnlab.quantize_kv_cache(jnp.asarray(x, jnp.bfloat16), dtype, gran)
        amax = np.abs(xb).max(axis=axes)
        want_s = np.where(amax > 0, amax / kq.QMAX[name], 1.0).astype(np.float32)
        assert c.dtype == np_dtype and s.dtype == np.float32 and s.shape == want_s.shape
        np.testing.assert_allclose(np.asarray(s), want_s, rtol=1e-6)
        y = xb / np.asarray(kq.broadcast_scale(np.asarray(s), gran))
        want = np.clip(np.round(y) if name == "int8" else y, -kq.QMAX[name], kq.QMAX[name]).astype(np_dtype)
        got = np.asarray(c)
        assert np.abs(got.astype(np.float32)).max() == kq.QMAX[name]        # the group's absmax lands on QMAX
        # XLA may divide as x * (1 / s): a value on a rounding boundary may land one step away
        assert np.mean(got != want) < 0.01, (name, gran)
    assert np.asarray(attnlab.quantize_kv_cache(jnp.asarray(x), "int8", "token")[1])[1, 3, 0] == 1.0
    with pytest.raises(ValueError, match="kv cache dtype must be one of"):
        attnlab.quantize_kv_cache(jnp.asarray(x), "fp4")
    assert [kq.canonical_kv_dtype(n) for n in ("FP8", "E5M2", "Int8")] == ["float8_e4m3fn", "float8_e5m2", "int8"]


@pytest.mark.parametrize("dtype", ["fp8", "e5m2", "int8"])
def test_a_group_of_tiny_values_keeps_finite_codes(dtype):
    """amax / QMAX below float32's smallest normal gave scale 0 and codes 0/0 = NaN (every row reading the group NaN):
    the scale is at least float32's tiny, so the codes stay in range and dequantize close to the values."""
    x = jnp.asarray(np.array([1.0, -0.7, 0.3, 0.0], np.float32).reshape(1, 1, 1, 4) * 1e-37)
    c, s = attnlab.quantize_kv_cache(x, dtype, "token")
    back = np.asarray(kq.dequantize(np.asarray(c), np.asarray(s), "token", "float64"))
    assert np.all(np.isfinite(back)) and float(s.reshape(())) > 0
    np.testing.assert_allclose(back, np.asarray(x, np.float64), rtol=0.3, atol=0.02e-37)
    with pytest.raises(ValueError, match="granularity must be one of"):
        attnlab.quantize_kv_cache(jnp.asarray(x), "fp8", "channel")


def _call(kind, q, kc, vc, lens, **kw):
    if kind == "decode":
        return attnlab.decode_attention(q, kc, vc, lens, implementation="xla", **kw)
    starts = np.arange(q.shape[0] + 1, dtype=np.int32)         # one token per request
    return attnlab.serving_attention(q.reshape(-1, *q.shape[2:]), kc, vc, starts, lens, implementation="xla", **kw)


_Q, _K, _V = random_qkv(2, 1, 32, 4, 2, 16, "bfloat16", seed=1)
_KQ, _KS = attnlab.quantize_kv_cache(_K, "fp8")
_VQ, _VS = attnlab.quantize_kv_cache(_V, "fp8")
_BAD = {   # (k_cache, v_cache, kwargs) -> (error type, message)
    "no scales": ((_KQ, _VQ, {}), (TypeError, "k_cache has the quantized dtype float8_e4m3fn: give k_scale and v_scale")),
    "no scales, v quantized": ((_K, _VQ, {}), (TypeError, "v_cache has the quantized dtype float8_e4m3fn: give k_scale")),
    "scales on bf16": ((_K, _V, dict(k_scale=_KS, v_scale=_VS)), (TypeError, "k_cache must have a quantized dtype")),
    "one scale": ((_KQ, _VQ, dict(k_scale=_KS)), (ValueError, "k_scale and v_scale go together")),
    "bad shape": ((_KQ, _VQ, dict(k_scale=_KS[:, :4], v_scale=_VS)), (ValueError, r"k_scale shape \(2, 4, 2\) is not a scale layout")),
    "page on contiguous": ((_KQ, _VQ, dict(k_scale=_KS[:, 0], v_scale=_VS[:, 0])), (ValueError, "not a scale layout of the contiguous")),
    "f16 scale": ((_KQ, _VQ, dict(k_scale=_KS.astype(jnp.float16), v_scale=_VS)), (TypeError, "k_scale must be float32")),
    "mixed dtypes": ((_KQ, _VQ.astype(jnp.int8), dict(k_scale=_KS, v_scale=_VS)), (TypeError, "share one quantized dtype")),
    "nan tensor scale": ((_KQ, _VQ, dict(k_scale=jnp.float32(1), v_scale=jnp.float32(jnp.nan))),
                         (ValueError, "v_scale must be finite, got nan")),
    "inf head scale": ((_KQ, _VQ, dict(k_scale=jnp.array([1, jnp.inf], jnp.float32), v_scale=jnp.ones((2,), jnp.float32))),
                       (ValueError, "k_scale must be finite, got inf at KV head 1")),
    "layouts differ": ((_KQ, _VQ, dict(k_scale=_KS, v_scale=jnp.ones((2,), jnp.float32))), (ValueError, "share one layout")),
}


@pytest.mark.parametrize("kind", ["decode", "serving"])
@pytest.mark.parametrize("case", list(_BAD))
def test_quantized_cache_arguments_are_checked_up_front(kind, case):
    (kc, vc, kw), (exc, match) = _BAD[case]
    with pytest.raises(exc, match=match):
        _call(kind, _Q, kc, vc, jnp.array([32, 9], jnp.int32), **kw)


def test_masked_paths_dequantize_and_other_backends_refuse():
    lens = np.array([32, 9], np.int32)
    ref = attnlab.reference_decode_attention(_Q, _KQ, _VQ, lens, k_scale=_KS, v_scale=_VS)
    for impl in ("xla",):
        out = attnlab.decode_attention(_Q, _KQ, _VQ, lens, k_scale=_KS, v_scale=_VS, implementation=impl)
        assert out.dtype == _Q.dtype and check_decode_close(out, _Q, _KQ, _VQ, lens, k_scale=_KS, v_scale=_VS).ok
        assert rel_l2(out, ref) < 1e-2
    out = _call("serving", _Q, _KQ, _VQ, lens, k_scale=_KS, v_scale=_VS)
    assert rel_l2(out.reshape(_Q.shape), ref) < 1e-2
    with pytest.raises(UnsupportedError, match="k_scale/v_scale: no quantized KV cache"):
        attnlab.decode_attention(_Q, _KQ, _VQ, lens, k_scale=_KS, v_scale=_VS, implementation="tokamax-xla")
    reasons = attnlab.explain_decode(_Q, _KQ, _VQ, lens, k_scale=_KS, v_scale=_VS).reasons
    assert reasons["xla"] is None and reasons["attnlab-decode"] is None and "k_scale" in reasons["tokamax-xla"]
    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (_Q, _KQ, _VQ)]     # explain takes abstract arrays
    tensor = jax.ShapeDtypeStruct((), jnp.float32)                                  # a shared scale has no values
    assert attnlab.explain_decode(*shapes, lens, k_scale=tensor, v_scale=tensor).reasons["xla"] is None


# (dtype name, scale layout, q dtype, T, page size or None): GQA G=4, ragged lengths, block_k 16 / 2 splits
DECODE_CASES = {
    "fp8-token-bf16-cap-jit": ("fp8", "token", "bfloat16", 3, None),
    "e5m2-page-f16-ps8-gather": ("e5m2", "page", "float16", 2, 8),
    "int8-token-f32-T1-ps32": ("int8", "token", "float32", 1, 32),
    "fp8-token-bf16-mma16-ps16": ("fp8", "token", "bfloat16", 2, 16),      # float16 products, q scaled per row
    # read as int16 pairs of bytes (``DecodeConfig.kv_pairs``): contiguous, paged, one split stored directly
    "fp8-token-bf16-mma16-pairs-cap": ("fp8", "token", "bfloat16", 3, None),
    "fp8-tensor-bf16-mma16-pairs-ps8-direct": ("fp8", "tensor", "bfloat16", 1, 8),
    "e5m2-head-f16-pairs-ps4-gather": ("e5m2", "head", "float16", 2, 4),
    # negative value scales (a caller's own): float16 products scale P by s / max |s| (max s would be 1e-30)
    "fp8-token-bf16-mma16-negv": ("fp8", "token", "bfloat16", 2, None),
    "fp8-token-bf16-mma16-pairs-negv": ("fp8", "token", "bfloat16", 2, None),
}


@pytest.mark.parametrize("case", list(DECODE_CASES))
def test_decode_kernel_dequantizes_in_registers(case):
    name, layout, dtype, T, ps = DECODE_CASES[case]
    B, S, N, K, H = 2, 64, 8, 2, 16
    q, k, v = random_qkv(B, T, S, N, K, H, dtype, seed=len(case))
    lens = np.array([64, 21], np.int32)
    cap = 3.0 if "cap" in case else None
    table = None
    if ps:
        k, v, table = to_pages(k, v, ps)
    (kc, ks), (vc, vs) = (attnlab.quantize_kv_cache(x, name, layout) for x in (k, v))
    if "negv" in case:
        vs = -vs
    call = functools.partial(kd.decode_attention_pallas, causal=True, interpret=True, soft_cap=cap, kv_scale=layout,
                             config=kd.DecodeConfig(block_k=16, num_splits=1 if "direct" in case else 2,
                                                    kv_mma="float16" if "mma16" in case else "q", kv_pairs="pairs" in case,
                                                    whole_blocks="pairs" in case),
                             page_table=table)
    if "mma16" in case:   # rows of very different magnitudes: the per-row power of two keeps each in float16's range
        q = q * jnp.asarray([1e-6, 1.0, 3e4, 0.5, 1e-3, 2.0, 7e3, 1.0], q.dtype)[None, None, :, None]
    if "jit" in case:
        call = jax.jit(call)
    out = call(q, kc, vc, jnp.asarray(lens), k_scale=ks, v_scale=vs)
    kd64, vd64 = (kq.dequantize(np.asarray(c), np.asarray(s), layout, "float64") for c, s in ((kc, ks), (vc, vs)))
    if ps:
        kd64, vd64 = (gather_pages(x, np.asarray(table)) for x in (kd64, vd64))
    verdict = check_decode_close(out, q, kd64, vd64, lens, logits_soft_cap=cap)
    assert verdict.ok, verdict
    if "pairs" in case:    # the cache as int16 pairs (``kv_dequant.pair_view``), not silently read as bytes
        assert "i16[" in str(jax.make_jaxpr(call)(q, kc, vc, jnp.asarray(lens), k_scale=ks, v_scale=vs))


_ROWS = [1e-6, 1.0, 3e4, 0.5, 1e-3, 2.0, 7e3, 1.0]    # query heads' magnitudes: float16 products need the row scaling


def _serving_fp8(name, layout, dtype, ps, q_len, kv, config, cap=2.5, scaled_rows=False, seed=3, v_gain=None):
    """The serving kernel (interpret mode) on a quantized cache: (out, float64 of the dequantized cache, the plan, its
    traced body); N, K, H, S = 8, 2, 16, 48 and two padding tokens past the requests'. ``v_gain`` (S,): V's
    magnitude by key position."""
    rng = np.random.default_rng(seed)
    q_len, kv = np.asarray(q_len, np.int32), np.asarray(kv, np.int32)
    starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    N, K, H, S = 8, 2, 16, 48
    q = jnp.asarray(rng.standard_normal((int(starts[-1]) + 2, N, H)), dtype)
    if scaled_rows:
        q = q * jnp.asarray(_ROWS, q.dtype)[None, :, None]
    k, v = (jnp.asarray(rng.standard_normal((len(kv), S, K, H)), jnp.bfloat16) for _ in range(2))
    if v_gain is not None:
        v = v * jnp.asarray(v_gain[:S], v.dtype)[None, :, None, None]
    table = None
    if ps:
        k, v, table = to_pages(k, v, ps)
    (kc, ks), (vc, vs) = (attnlab.quantize_kv_cache(x, name, layout) for x in (k, v))
    kd64, vd64 = (kq.dequantize(np.asarray(c), np.asarray(s), layout, "float64") for c, s in ((kc, ks), (vc, vs)))
    if ps:
        kd64, vd64 = (gather_pages(x, np.asarray(table)) for x in (kd64, vd64))
    ref = reference_serving_attention(q, kd64, vd64, starts, kv, logits_soft_cap=cap)
    plan = attnlab.serving_plan(starts, kv, total_tokens=q.shape[0], kv_len_max=S, heads=N, kv_heads=K, head_dim=H,
                                config=config)
    run = functools.partial(attnlab.serving_attention, page_table=table, logits_soft_cap=cap, k_scale=ks, v_scale=vs,
                            implementation="attnlab-decode", plan=plan)
    out = run(q, kc, vc, starts, kv)
    assert out.dtype == q.dtype and not np.any(np.asarray(out)[int(starts[-1]):])    # padding rows stay 0
    return np.asarray(out, np.float64), ref, plan, str(jax.make_jaxpr(lambda x: run(x, kc, vc, starts, kv))(q))


@pytest.mark.parametrize("layout, ps, mma", [("head", None, None), ("token", 8, "q")],
                         ids=["fp8-head-contig-f16", "fp8-token-paged8-gather-q"])
def test_serving_kernel_dequantizes_in_registers(layout, ps, mma):
    """``mma`` None: the default products for FP8 and a bfloat16 q, float16, on query rows 1e-6..3e4 apart (the
    per-row power of two keeps each in float16's range); "q": in q's dtype. The cache read as bytes (``kv_pairs``
    off; ``test_serving_kernel_reads_fp8_as_pairs``: the default)."""
    cfg = sp.ServingConfig(block_k=16, decode_max_q=4, programs=3, kv_mma=mma, kv_pairs=False)   # decode tiles only
    out, ref, _, body = _serving_fp8("fp8", layout, jnp.bfloat16, ps, [1, 3, 2], [40, 48, 9], cfg,
                                     scaled_rows=mma is None)
    assert rel_l2(out, ref) < 8e-3 and "i16[" not in body   # bf16 P and output; read as bytes


def test_a_block_of_one_value_scale_rounds_p_as_a_tensor_scale_does():
    """int8 (bfloat16 products), pages of 16: page or token scales all equal to the tensor's give its output bit
    for bit, on the decode and the serving kernel. (P times each key's scale, rounded to bfloat16, lost the
    exact 1 of each row's largest term: 1.3x the error of the tensor scale.)"""
    B, S, N, K, H = 2, 64, 4, 1, 16
    q, k, v = random_qkv(B, 2, S, N, K, H, "bfloat16", seed=3)
    kp, vp, table = to_pages(k, v, 16)
    (kc, ks), (vc, vs) = (attnlab.quantize_kv_cache(x, "int8", "tensor") for x in (kp, vp))
    lens, starts = jnp.array([64, 30], jnp.int32), jnp.array([0, 2, 4], jnp.int32)
    outs = []
    for shape in ((), (kc.shape[0], K), kc.shape[:3]):
        kw = dict(page_table=jnp.asarray(table), implementation="attnlab-decode", k_scale=jnp.full(shape, ks),
                  v_scale=jnp.full(shape, vs))
        outs.append((np.asarray(attnlab.decode_attention(q, kc, vc, lens, **kw), np.float32),
                     np.asarray(attnlab.serving_attention(q.reshape(4, N, H), kc, vc, starts, lens, **kw), np.float32)))
    for page_or_token in outs[1:]:
        for got, want in zip(page_or_token, outs[0]):
            np.testing.assert_array_equal(got, want)


# ``ServingConfig(kv_pairs=True)``, FP8 read as int16 pairs: (dtype name, scale layout, q dtype, page size, merge,
# q_len, soft cap); block_k 16, 3 programs: units of several pieces, merged by log-sum-exp
SERVING_PAIR_CASES = {
    "fp8-token-bf16-contig-cap-fused": ("fp8", "token", "bfloat16", None, "fused", [1, 3, 2], 2.5),
    "fp8-tensor-bf16-ps8-kernel": ("fp8", "tensor", "bfloat16", 8, "kernel", [1, 3, 2], None),
    "e5m2-head-f16-contig-fused": ("e5m2", "head", "float16", None, "fused", [2, 1, 3], None),
    # a decode and a prefill class (the 7-token request: 2 tiles of 16 rows)
    "fp8-head-bf16-mixed-ps4-kernel": ("fp8", "head", "bfloat16", 4, "kernel", [1, 7, 2, 1], 2.5),
    "fp8-tensor-bf16-mixed-contig-fused": ("fp8", "tensor", "bfloat16", None, "fused", [1, 7, 2, 1], None),
}


@pytest.mark.parametrize("case", list(SERVING_PAIR_CASES))
def test_serving_kernel_reads_fp8_as_pairs(case):
    """The FP8 cache read as int16 pairs split into even and odd columns (``kv_dequant.byte_planes``), float16
    products, a per-head / per-tensor V scale once per piece: against float64, both merges, both classes."""
    name, layout, dtype, ps, merge, q_len, cap = SERVING_PAIR_CASES[case]
    kv = [48, 30, 9, 40][:len(q_len)]
    cfg = sp.ServingConfig(block_k=16, decode_max_q=4, programs=3, block_r_prefill=16, merge=merge, kv_pairs=True,
                           whole_blocks=merge == "fused")
    out, ref, plan, body = _serving_fp8(name, layout, dtype, ps, q_len, kv, cfg, cap=cap,
                                        scaled_rows=dtype == "bfloat16", seed=len(case))
    assert "i16[" in body       # the cache as int16 pairs (``kv_dequant.pair_view``)
    assert plan.kv_pairs and plan.merge == merge and len(plan.classes) == (2 if "mixed" in case else 1)
    assert any(np.any(np.diff(np.asarray(cp.units)[:, 3:5], axis=1) > 1) for cp in plan.classes)   # merged pieces
    assert rel_l2(out, ref) < 8e-3, rel_l2(out, ref)


# V's magnitude by key position: 1e-4 times 2^-6, 2^-2, 2^2, 2^6 over four 16-key blocks (2^12 apart): per-token
# scales (1e-8 in the first block) that float16 P holds only taken over a reference (``kv_dequant.pv_top``)
_V_GAIN = 1e-4 * 2.0 ** (np.arange(64) // 16 * 4 - 6)


@pytest.mark.parametrize("kind", ["decode", "decode-page-ps8", "serving"])
def test_pairs_hold_per_token_value_scales_far_apart(kind):
    """FP8 read as pairs, V scales per token 2^12 apart and all small: the request that sees only the first blocks,
    and the one that sees all, against float64 (each on its own: one request's error is not hidden by the other)."""
    if kind == "serving":
        cfg = sp.ServingConfig(block_k=16, decode_max_q=4, programs=3, kv_pairs=True, whole_blocks=True)
        out, ref, _, _ = _serving_fp8("fp8", "token", jnp.bfloat16, None, [1, 2], [48, 20], cfg, v_gain=_V_GAIN)
        outs, refs = (out[:1], out[1:3]), (ref[:1], ref[1:3])
    else:
        q, k, v = random_qkv(2, 2, 64, 8, 2, 16, "bfloat16", seed=5)
        v = v * jnp.asarray(_V_GAIN, v.dtype)[None, :, None, None]
        table = None
        if kind == "decode-page-ps8":
            k, v, table = to_pages(k, v, 8)
        layout = "page" if table is not None else "token"     # a scale per page of 8 keys: 2 pages a block
        (kc, ks), (vc, vs) = (attnlab.quantize_kv_cache(x, "fp8", layout) for x in (k, v))
        lens = np.array([64, 20], np.int32)
        out = kd.decode_attention_pallas(q, kc, vc, jnp.asarray(lens), interpret=True, kv_scale=layout, k_scale=ks,
                                         v_scale=vs, page_table=table,
                                         config=kd.DecodeConfig(block_k=16, num_splits=2, kv_mma="float16", kv_pairs=True,
                                                                whole_blocks=True))
        kd64, vd64 = (kq.dequantize(np.asarray(c), np.asarray(s), layout, "float64") for c, s in ((kc, ks), (vc, vs)))
        if table is not None:
            kd64, vd64 = (gather_pages(x, np.asarray(table)) for x in (kd64, vd64))
        ref = attnlab.reference_decode_attention(q, kd64, vd64, lens)
        outs, refs = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    for o, r in zip(outs, refs):
        assert rel_l2(o, r) < 8e-3, rel_l2(o, r)


@pytest.mark.parametrize("kv_dtype, q_dtype, mma, f16", [("fp8", "bfloat16", None, True), ("fp8", "bfloat16", "q", False),
                                                        ("int8", "bfloat16", None, False), ("e5m2", "float32", None, False),
                                                        ("e5m2", "float32", "float16", True)])
def test_serving_products_follow_kv_products(kv_dtype, q_dtype, mma, f16):
    """The serving kernel's products are float16 where ``decode_plan.kv_products`` says (FP8 and a bfloat16 q, or
    ``ServingConfig(kv_mma="float16")``), q's dtype otherwise: float16 arrays appear in its traced body or not."""
    from attnlab.kernels import serving as ks

    starts, kv = np.array([0, 1, 3], np.int32), np.array([16, 9], np.int32)
    q = jnp.zeros((4, 4, 16), q_dtype)
    kc, sc = attnlab.quantize_kv_cache(jnp.ones((2, 16, 2, 16)), kv_dtype, "token")
    plan = sp.make_serving_plan(starts, kv, total_tokens=4, kv_len_max=16, heads=4, kv_heads=2, head_dim=16,
                                config=sp.ServingConfig(kv_mma=mma, kv_pairs=False))
    trace = functools.partial(jax.make_jaxpr(functools.partial(ks.serving_attention_pallas, interpret=True,
                                                               kv_scale="token")), q, kc, kc, starts, kv, k_scale=sc,
                              v_scale=sc)
    body = str(trace(plan=plan))
    assert bool(re.search(r"\bf16\[", body)) == f16 and "i16[" not in body
    # ``kv_pairs`` (int16 pairs of bytes; the default) where the products are float16 and the cache FP8: every f16
    # case here
    pairs = sp.make_serving_plan(starts, kv, total_tokens=4, kv_len_max=16, heads=4, kv_heads=2, head_dim=16,
                                 config=sp.ServingConfig(kv_mma=mma))
    assert pairs.kv_pairs and ("i16[" in str(trace(plan=pairs))) == f16
    with pytest.raises(ValueError, match="kv_mma must be None, 'q' or 'float16'"):
        sp.make_serving_plan(starts, kv, total_tokens=4, kv_len_max=16, heads=4, kv_heads=2, head_dim=16,
                             config=sp.ServingConfig(kv_mma="bfloat16"))


def test_quantized_decode_lowers_to_triton_for_cuda_without_a_gpu():
    s = jax.ShapeDtypeStruct
    B, T, S, N, K, H = 4, 4, 8192, 32, 8, 128
    f8 = jnp.float8_e4m3fn
    for ps, layout, scale_shape, f8, mma, pairs in ((None, "token", (B, S, K), f8, None, False),
                                                    (16, "page", (B * S // 16, K), f8, "q", True),
                                                    (None, "head", (K,), jnp.int8, None, True),
                                                    (None, "tensor", (K,), f8, None, True)):
        plan = kd.make_plan(B, T, S, N, K, H, "bfloat16", kd.DecodeConfig(kv_mma=mma, kv_pairs=pairs), sms=132,
                            compute_capability=(9, 0), kv_dtype=str(jnp.dtype(f8)))
        assert plan.kv_mma == ("float16" if mma is None and f8 != jnp.int8 else None)   # FP8: float16 products
        assert plan.kv_pairs == (pairs and plan.kv_mma == "float16")   # FP8 with float16 products only
        f = jax.jit(functools.partial(kd.decode_attention_pallas, causal=True, interpret=False, plan=plan, kv_scale=layout))
        kv = (B, S, K, H) if ps is None else (B * S // ps, ps, K, H)
        kw = dict(k_scale=s(scale_shape, jnp.float32), v_scale=s(scale_shape, jnp.float32))
        if ps:
            kw["page_table"] = s((B, S // ps), jnp.int32)
        with kd.cuda_lowering_context():
            text = f.trace(s((B, T, N, H), jnp.bfloat16), s(kv, f8), s(kv, f8), s((B,), jnp.int32),
                           **kw).lower(lowering_platforms=("cuda",)).as_text()
        assert "triton" in text


def test_quantized_serving_lowers_to_triton_for_cuda_without_a_gpu():
    """Paged e5m2 per token and, ``ServingConfig(kv_pairs=True)``, read as int16 pairs per token and per tensor (the V
    scale after the pieces' loop): the pairs' inline PTX (``kv_dequant.byte_planes``) in the kernel, not without."""
    from attnlab.kernels import serving as ks

    s = jax.ShapeDtypeStruct
    B, S, N, K, H, ps, Ttot = 4, 4096, 32, 8, 128, 16, 512
    for layout, pairs in (("token", False), ("token", True), ("tensor", True)):
        def step(q, k, v, a, b, t, sk, sv):
            plan = sp.make_serving_plan(a, b, total_tokens=Ttot, kv_len_max=S, heads=N, kv_heads=K, head_dim=H,
                                        config=sp.ServingConfig(kv_pairs=pairs))
            return ks.serving_attention_pallas(q, k, v, a, b, plan=plan, page_table=t, interpret=False, k_scale=sk,
                                               v_scale=sv, kv_scale=layout)

        kv = s((B * S // ps, ps, K, H), jnp.float8_e5m2)
        sc = s((B * S // ps, ps, K) if layout == "token" else (K,), jnp.float32)
        with kd.cuda_lowering_context():
            text = jax.jit(step).trace(s((Ttot, N, H), jnp.bfloat16), kv, kv, s((B + 1,), jnp.int32),
                                       s((B,), jnp.int32), s((B, S // ps), jnp.int32), sc,
                                       sc).lower(lowering_platforms=("cuda",)).as_text()
        assert "triton" in text and ("cvt.rn.f16x2.e5m2x2" in text) == pairs, (layout, pairs)
