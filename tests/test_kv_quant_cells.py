"""Quantized KV caches in the cost model, the sweeps, the records, the error report and advise (cheap: no kernel)."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab import backends
from attnlab.core import kv_quant as kq
from attnlab.core.record_model import CellRecord
from attnlab.core.problem import Problem
from attnlab.core.serving_cost import serving_bytes
from attnlab.core.workload import Workload, kv_cache_bytes
from attnlab.measure import Options
from attnlab.measure.cell import Cell, measure_cell
from attnlab.measure.kv_cells import kv_cache_errors
from attnlab.measure.recount import recount
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.inputs import random_qkv
from attnlab.sweep import SweepError, build


def test_bytes_count_the_cache_at_its_dtype_plus_the_scales():
    B, T, S, N, K, H = 2, 4, 1024, 32, 8, 128
    lens = (1024, 100)
    bf16 = Workload(B, T, S, N, K, H, "bfloat16", True, kv_lengths=lens, decode=True)
    q_and_out = bf16.bytes() - 2 * sum(lens) * K * H * 2
    for layout, scales in (("token", 2 * 4 * sum(lens) * K), ("page", 2 * 4 * (16 + 2) * K), ("head", 2 * 4 * K),
                           ("tensor", 2 * 4)):
        w = Workload(B, T, S, N, K, H, "bfloat16", True, kv_lengths=lens, decode=True, kv_dtype="fp8", kv_scale=layout,
                     page_size=64)
        assert w.kv_dtype == "float8_e4m3fn" and w.kv_bytes() == 2 * sum(lens) * K * H + scales
        assert w.bytes() == q_and_out + w.kv_bytes()
    assert w.flops() == bf16.flops()
    with pytest.raises(ValueError, match="forward pass only"):
        w.bytes("fwd+bwd")
    with pytest.raises(ValueError, match="kv_scale must be one of"):
        Workload(B, T, S, N, K, H, kv_dtype="int8")
    for bad in (-16, 3.5, True, 0):
        with pytest.raises(ValueError, match="page_size must be None or an int >= 1"):
            Workload(B, T, S, N, K, H, kv_lengths=lens, decode=True, kv_dtype="fp8", kv_scale="page", page_size=bad)
    with pytest.raises(ValueError, match="kv_scale 'token' needs kv_dtype"):
        Workload(B, T, S, N, K, H, kv_scale="token")
    with pytest.raises(ValueError, match="kv_scale 'token' needs a quantized"):
        kv_cache_bytes(layers=2, kv_heads=8, head_dim=128, context=10, kv_scale="token")
    assert kv_cache_bytes(layers=2, kv_heads=8, head_dim=128, context=10, dtype="int8", kv_scale="token") == \
        2 * 2 * 8 * (128 + 4) * 10
    starts, kv = np.array([0, 1, 3]), np.array([100, 50])
    assert serving_bytes(starts, kv, 8, 2, 64, 2, kv_itemsize=1, kv_scale="token") == \
        serving_bytes(starts, kv, 8, 2, 64, 2) - 150 * 2 * 64 * 2 + 2 * 4 * 150 * 2


@pytest.mark.parametrize("window", [None, (3, 0), (40, 0)])
def test_page_scales_count_the_pages_the_keys_read_lie_in(window):
    """A ``page`` scale layout reads one scale per KV head of each page holding a key some query sees: with a
    window, from its first key's page (pages of 16; request 0: T=1 at position 255, request 1: T=3 ending at 19)."""
    starts, kv, ps = np.array([0, 1, 4]), np.array([256, 20]), 16
    pages = {None: 16 + 2, (3, 0): 1 + 2, (40, 0): 3 + 2}[window]     # request 1's keys 0..19 (a window of 3: 14..19)
    p = Problem(2, 4, 256, 2, 1, 8, "bfloat16", True, window, (1, 3), tuple(kv), True, kv_dtype="fp8",
                kv_scale="page", page_size=ps)
    assert p.scale_bytes() == 2 * 4 * pages
    assert p.bytes() == serving_bytes(starts, kv, 2, 1, 8, 2, None if window is None else window[0], kv_itemsize=1,
                                      kv_scale="page", page_size=ps)


def test_kv_dtype_makes_forward_decode_cells_only():
    sw = build({"backends": "attnlab-decode", "q_len": "2", "kv_len": "64", "heads": "8", "kv_heads": "2",
                "head_dim": "32", "lengths": "none,full,paged16", "mode": "fwd,fwd+bwd",
                "kv_dtype": "none,fp8,int8:page"})
    got = {(c.lengths, c.mode, c.kv_dtype, c.kv_scale) for c in sw.cells()}
    assert ("full", "fwd", "float8_e4m3fn", "token") in got and ("paged", "fwd", "int8", "page") in got
    assert all(kvd is None for ln, m, kvd, _ in got if ln is None or m != "fwd")
    assert ("full", "fwd", "int8", "page") not in got          # page scales: paged cells only
    for bad, match in (("fp4", "kv cache dtype must be one of"), ("fp8:channel", "scale layout must be one of")):
        with pytest.raises(SweepError, match=match):
            build({"backends": "xla", "kv_dtype": bad})
    with pytest.raises(ValueError, match="needs a forward decode cell"):
        Cell("xla", 1, 2, 64, 2, 1, 16, "bfloat16", True, kv_dtype="fp8")
    c = Cell("xla", 1, 2, 64, 2, 1, 16, "bfloat16", True, lengths="full", kv_dtype="e5m2")
    assert (c.kv_dtype, c.kv_scale) == ("float8_e5m2", "token") and "kv=float8_e5m2:token" in c.config_label
    from attnlab.measure import ahead
    assert "quantized KV cache" in ahead.why_not(c)     # its timed call takes the cache and scales, not (q, k, v)


@pytest.mark.parametrize("paged", [False, True])
def test_a_quantized_decode_cell_is_checked_on_the_dequantized_cache_and_records_its_error(paged):
    # paged: int8 with a scale per page (the check's twin reads the pages in their order)
    kw = dict(lengths="paged", page_size=16, kv_dtype="int8", kv_scale="page") if paged else dict(
        lengths="ragged", kv_dtype="fp8")
    cell = Cell("attnlab-decode" if paged else "xla", 2, 2, 64, 4, 2, 16, "bfloat16", True, **kw)
    rec = measure_cell(cell, Options(repeats=1, warmup=0, min_time_s=0.0))
    assert rec["status"] == "ok", rec["reason"]
    if paged:
        assert rec["kv_scale"] == "page" and rec["rel_err"] < 5e-3 < rec["kv_rel_err"] < 0.1
        return
    assert rec["kv_dtype"] == "float8_e4m3fn" and rec["kv_scale"] == "token"
    assert rec["rel_err"] < 5e-3 < rec["kv_rel_err"] < 0.1      # the kernel is right; the cache costs ~3%
    assert rec["bytes"] == cell.workload.bytes() < Cell("xla", 2, 2, 64, 4, 2, 16, "bfloat16", True,
                                                        lengths="ragged").workload.bytes()
    assert CellRecord.from_flat(rec).flat()["kv_rel_err"] == rec["kv_rel_err"]
    assert recount(rec)["bytes"] == rec["bytes"]


@pytest.mark.parametrize("backend,lengths", [("naive", "ragged"), ("xla", "one-long")])
def test_a_float64_cell_dequantizes_its_cache_in_float64(backend, lengths):
    """A float64 decode (naive) or serving (xla) cell: the masked path and every check dequantize in float64 (in
    float32, stored x scale rounded: "incorrect" at 2.5e-8 against float64's 1e-10 limit)."""
    cell = Cell(backend, 1, 2, 16, 2, 1, 8, "float64", True, lengths=lengths, kv_dtype="int8", kv_scale="tensor")
    rec = measure_cell(cell, Options(repeats=1, warmup=0, min_time_s=0.0))
    assert rec["status"] == "ok" and rec["rel_err"] < 1e-14, rec["reason"]


def test_kv_cache_errors_report_quantized_next_to_bf16_per_distribution():
    rows = kv_cache_errors(1, 1, 64, 2, 1, 16, kv_dtypes=("int8", "fp8"), distributions=("gaussian", "channel-outliers"))
    assert [(r["inputs"], r["kv_dtype"]) for r in rows] == [
        ("gaussian", "int8"), ("gaussian", "float8_e4m3fn"), ("channel-outliers", "int8"),
        ("channel-outliers", "float8_e4m3fn")]
    for r in rows:
        assert r["bf16_rel_err"] < r["rel_err"] < 0.1
    assert rows[0]["rel_err"] < rows[1]["rel_err"]              # int8 keeps 7 bits, e4m3 3


def test_advise_memory_table_per_cache_dtype():
    from attnlab.core.models import preset
    from attnlab.report.advice import memory_rows

    p = preset("llama-3.1-8b")                                  # 32 layers, 8 KV heads, head dim 128
    m = memory_rows(p, [4096], 141 * 10**9)[0]["by_kv_dtype"]
    assert m["bfloat16"]["bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    assert m["float8_e4m3fn"]["bytes_per_token"] == m["int8"]["bytes_per_token"] == 2 * 32 * 8 * (128 + 4)
    assert m["float8_e4m3fn"]["max_batch"] == (141 * 10**9 - p.weight_bytes(2)) // (4096 * 2 * 32 * 8 * 132)
    assert m["float8_e4m3fn"]["max_batch"] >= 1.9 * m["bfloat16"]["max_batch"]
    # a model's cells are the bf16 cache's: a record of a quantized cache is never taken for one
    from attnlab.core.model_plan import plan

    from attnlab.sweep.spec import Sweep

    e = next(e for e in plan(p, "decode", "4k") if e.lengths)
    bf16, fp8 = (Sweep(["xla"], **{**e.axes(), "kv_dtype": [kv]}).cells()[0].identity()
                 for kv in (None, ("float8_e4m3fn", "token")))
    assert e.matches(bf16) and not e.matches(fp8)


def test_the_quantized_check_gives_its_verdict_through_the_shared_helper():
    """kv_cells.check_output (as check.check_serving and check.check_output) records and refuses through
    outcome.judged, after check.check_into's output_dtype: the fields ride on the Skip, the reason names
    the error and its limit."""
    import types

    import attnlab
    import jax.numpy as jnp

    from attnlab import backends
    from attnlab.measure.check import check_into
    from attnlab.measure.kv_cells import check_output, quantized_caches
    from attnlab.measure.outcome import Skip
    from attnlab.reference.inputs import random_qkv

    cell = Cell("xla", 2, 1, 32, 2, 1, 16, "float32", True, lengths="ragged", kv_dtype="int8")
    q, k, v = random_qkv(2, 1, 32, 2, 1, 16, "float32", seed=1)
    caches = kc, ks, vc, vs = quantized_caches(cell, k, v)
    out = attnlab.decode_attention(q, kc, vc, jnp.asarray(cell.kv_lengths()), k_scale=ks, v_scale=vs,
                                   implementation="xla")
    ok = check_output(out, (q, k, v), caches, cell, {})
    assert ok["checks"]["float64_dequantized"]["ok"] and ok["rel_err"] == ok["rel_err_f64"] < 1e-5 < ok["kv_rel_err"]
    halved = quantized_caches(cell, k * 0.5, v)     # the check dequantizes the timed call's caches, not its own
    out_halved = attnlab.decode_attention(q, halved[0], halved[2], jnp.asarray(cell.kv_lengths()), k_scale=halved[1],
                                          v_scale=halved[3], implementation="xla")
    assert check_output(out_halved, (q, k, v), halved, cell, {})["checks"]["float64_dequantized"]["ok"]
    with pytest.raises(Skip, match=r"^output wrong: rel L2 \S+ \(limit \S+\) \(float32") as e:
        check_output(out * 1.01, (q, k, v), caches, cell, {})
    assert e.value.fields["kv_rel_err"] > 0 and not e.value.fields["checks"]["float64_dequantized"]["ok"]
    run = types.SimpleNamespace(output=lambda: out.astype("bfloat16"), ins=types.SimpleNamespace(sets=[(q, k, v)],
                                extras={}), caches=caches)
    with pytest.raises(Skip, match="output bfloat16 is not the cell's float32"):   # the check of every cell, first
        check_into({}, run, cell, backends.get("xla"), Options())


def test_a_nan_in_a_sequence_the_check_does_not_sample_is_incorrect():
    """The quantized cache's check samples 8 of a batch of 10 (0, 1, 3, 4, 5, 6, 8, 9); a NaN in sequence 2 still
    fails the cell (every value of the output must be finite)."""
    class MiddleNaN(type(backends.get("xla"))):
        name = "fake-middle-nan"

        def run_decode(self, d):
            return super().run_decode(d).at[2, 0, 0, 0].set(jnp.nan)

    backends.register(MiddleNaN())
    try:
        cell = Cell("fake-middle-nan", 10, 1, 32, 2, 1, 16, "float32", True, lengths="ragged", kv_dtype="int8")
        rec = measure_cell(cell, Options(repeats=1, warmup=0, min_time_s=0.0))
    finally:
        backends.unregister("fake-middle-nan")
    assert rec["status"] == "incorrect" and "1 values are NaN or Inf" in rec["reason"], rec["reason"]


def test_the_quantized_check_reads_every_sequence_of_a_small_batch():
    """A wrong middle sequence (its output zeroed) of a batch of 3: the float64 check reads every batch element
    up to ``CHECKED_SEQUENCES`` (it read the first and the last only)."""
    import attnlab
    import jax.numpy as jnp

    from attnlab.measure.kv_cells import check_output, quantized_caches
    from attnlab.measure.outcome import Skip
    from attnlab.reference.inputs import random_qkv

    cell = Cell("xla", 3, 1, 32, 2, 1, 16, "float32", True, lengths="ragged", kv_dtype="int8")
    q, k, v = random_qkv(3, 1, 32, 2, 1, 16, "float32", seed=2)
    caches = kc, ks, vc, vs = quantized_caches(cell, k, v)
    out = attnlab.decode_attention(q, kc, vc, jnp.asarray(cell.kv_lengths()), k_scale=ks, v_scale=vs,
                                   implementation="xla")
    assert check_output(out, (q, k, v), caches, cell, {})["checked_fraction"] == 1.0
    with pytest.raises(Skip, match="output wrong"):
        check_output(out.at[1].set(0.0), (q, k, v), caches, cell, {})


@pytest.mark.parametrize("base, kv", [("xla", dict(lengths="ragged", kv_dtype="int8")),
                                      ("attnlab-decode", dict(lengths="paged", page_size=16, kv_dtype="fp8",
                                                              kv_scale="page"))])
def test_a_wrong_sequence_the_float64_sample_misses_fails_the_whole_check(base, kv):
    """The float64 check samples 8 of a batch of 10 (0, 1, 3, 4, 5, 6, 8, 9); sequence 2 computed with the cache's
    mean scale (a per-tensor scale where the cache has one per token or page: rel error ~0.4) fails the check of
    every sequence against float32 on the dequantized cache."""
    class WrongScale(type(backends.get(base))):
        name = "fake-wrong-scale"

        def run_decode(self, d):
            out = super().run_decode(d)
            flat = dataclasses.replace(d, k_scale=jnp.full_like(d.k_scale, jnp.mean(d.k_scale)),
                                       v_scale=jnp.full_like(d.v_scale, jnp.mean(d.v_scale)))
            return out.at[2].set(super().run_decode(flat)[2])

    backends.register(WrongScale())
    try:
        cell = Cell("fake-wrong-scale", 10, 1, 64, 2, 1, 16, "float32", True, **kv)
        rec = measure_cell(cell, Options(repeats=1, warmup=0, min_time_s=0.0))
    finally:
        backends.unregister("fake-wrong-scale")
    assert rec["status"] == "incorrect" and "output wrong (every sequence)" in rec["reason"], rec["reason"]
    assert rec["checks"]["float64_dequantized"]["ok"] and not rec["checks"]["every_sequence_float32_device"]["ok"]


def test_a_wrong_dequantization_in_the_paths_fails_every_verdict(monkeypatch):
    """The masked paths divide by the scale instead of multiplying (a convention mix-up): the truths read the cache
    with their own code (reference.dequant64), so check_decode_close, the decode cell and the serving cell fail it."""
    from attnlab.backends import masked_decode

    monkeypatch.setattr(masked_decode, "dequantize", lambda c, s, layout, dtype, xp: (
        xp.asarray(c).astype(dtype) / kq.broadcast_scale(xp.asarray(s).astype(dtype), layout, xp)))
    q, k, v = random_qkv(2, 1, 64, 4, 2, 16, "bfloat16", seed=3)
    (kc, ks), (vc, vs) = (kq.quantize_kv_cache(x, "fp8", "head") for x in (k, v))
    lens = np.array([64, 40], np.int32)
    out = attnlab.decode_attention(q, kc, vc, lens, k_scale=ks, v_scale=vs, implementation="xla")
    assert not check_decode_close(out, q, kc, vc, lens, k_scale=ks, v_scale=vs).ok
    decode = Cell("xla", 2, 2, 64, 4, 2, 16, "bfloat16", True, lengths="ragged", kv_dtype="fp8")
    serving = Cell("xla", 3, 2, 64, 4, 2, 16, "bfloat16", True, lengths="one-long", kv_dtype="fp8",
                   prefill_chunks="1x8")
    for cell in (decode, serving):
        rec = measure_cell(cell, Options(repeats=1, warmup=0, min_time_s=0.0, compile_ahead=False))
        assert rec["status"] == "incorrect", (cell.label, rec["status"], rec.get("reason"))
