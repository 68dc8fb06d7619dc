"""No record faster than the hardware (attnlab.core.rate_check): a rate above the datasheet peak by more than
the timer's noise is an error of attnlab; every committed record in results/ loads and is below the peak."""
import glob
import json
import os
import types

import pytest

from attnlab.core.rate_check import NOISE_FLOOR, RateAbovePeakError, check_rates, timer_noise
from attnlab.core.records import RecordError, is_cell, upgrade, validate
from attnlab.measure.recount import recount

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H200 = {"device_kind": "NVIDIA H200"}


def packed_record(kernel_ms=0.4438, spread=0.002):
    """The report's cell: cudnn, --packing docs:6, B=2 T=8192 N=16 H=128 causal, counted as every causal pair
    (the counter before packed documents): 1239 TFLOP/s, 125% of the H200's bf16 peak."""
    flops = 4.0 * 16 * 128 * (2 * 8192 * 8193 // 2)
    lo, hi = kernel_ms * (1 - spread / 2), kernel_ms * (1 + spread / 2)
    return {"schema": 2, "backend": "cudnn", "batch": 2, "q_len": 8192, "kv_len": 8192, "heads": 16, "kv_heads": 16,
            "head_dim": 128, "dtype": "bfloat16", "causal": True, "window": None, "mode": "fwd", "packing": "docs:6",
            "status": "ok", "reason": None, "timer": "cupti", "kernel_ms": kernel_ms, "kernel_min_ms": lo,
            "kernel_p25_ms": kernel_ms, "kernel_p75_ms": kernel_ms, "kernel_max_ms": hi, "kernel_n": 20,
            "flops": flops, "bytes": 4 * 2 * 8192 * 16 * 128 * 2, "input_sets": 2, "tflops": flops / kernel_ms / 1e9,
            "peak_dtype": "bf16", "peak_tflops": 989.4, "rel_err": 0.002, "checked_fraction": 1.0,
            "tolerance": "bf16", "checks": {"float32_device": {"ok": True}}, "env": H200}


def test_the_packed_cell_of_the_report_is_an_error_of_attnlab_and_its_recount_is_a_result():
    rec = packed_record()
    assert rec["tflops"] == pytest.approx(1239, abs=1)
    with pytest.raises(RateAbovePeakError) as e:
        validate(rec)
    assert e.value.field == "flops" and "bug in attnlab" in str(e.value) and "125%" in str(e.value)
    fixed = recount(rec)
    assert 400 < fixed["tflops"] < 450 and validate(fixed) is fixed     # pairs inside the 6 documents only


@pytest.mark.parametrize("above, spread, ok", [(0.015, 0.001, True), (0.03, 0.001, False), (0.05, 0.10, True),
                                               (0.12, 0.10, False)])
def test_the_bound_is_raised_by_the_timer_noise(above, spread, ok):
    rec = packed_record(spread=spread)
    rec["flops"] = 989.4e9 * rec["kernel_ms"] * (1 + above)
    assert timer_noise(rec)[0] == pytest.approx(max(NOISE_FLOOR, spread))
    if ok:
        check_rates(rec)
    else:
        with pytest.raises(RateAbovePeakError):
            check_rates(rec)


@pytest.mark.parametrize("change, ok", [
    ({}, False),                                        # 5.3 TB/s of HBM traffic on a 4.8 TB/s device
    ({"input_sets": 1, "bytes": 53e6, "ms": 0.01}, True),   # 5.3 TB/s from inputs that fit in L2: served from it
    ({"input_sets": 2, "bytes": 53e6, "ms": 0.01}, False),  # ... which two sets of them do not
    ({"devices": 2}, True),                             # two devices: twice the bandwidth
    ({"devices": 8, "input_sets": 1, "bytes": 8 * 53e6, "ms": 0.0092}, True),   # 46 TB/s from 8 devices' L2s: each
    ({"devices": 8, "input_sets": 2, "bytes": 8 * 53e6, "ms": 0.0092}, False),  # holds 53 MB, or 106 MB, of it
    ({"dtype": "float64", "peak_dtype": "tf32", "flops": 200e9, "bytes": 1e9}, False),  # 200 TFLOP/s: float64's
    ({"dtype": "float64", "peak_dtype": "fp32", "flops": 60e9, "bytes": 1e9}, True),    # peak is FP32's, not TF32's
    ({"env": {"device_kind": "cpu"}, "peak_tflops": None}, True),   # no datasheet: not bounded
    ({"peak_dtype": "fp8", "flops": 1.5e12, "bytes": 1e9}, True),   # an fp8 backend: bounded by the fp8 peak
    ({"peak_dtype": None, "flops": 1.5e12, "bytes": 1e9}, False),
])
def test_bandwidth_devices_and_dtype_bounds(change, ok):
    change = dict(change)
    rec = {**packed_record(kernel_ms=change.pop("ms", 1.0)), "flops": 1e9, "bytes": 5.3e9, **change}
    if ok:
        check_rates(rec)
    else:
        with pytest.raises(RecordError):
            check_rates(rec)


def _committed_cells():
    for path in sorted(glob.glob(os.path.join(ROOT, "results", "**", "*.jsonl"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and is_cell(rec):
                    yield f"{os.path.relpath(path, ROOT)}: record {i}: ", upgrade(rec)


def test_no_committed_record_is_above_the_datasheet_peak():
    """Every timed cell record of results/, as stored and as today's counter recounts it (test_record_schema
    loads a sample of each file through the whole validator, which runs check_rates)."""
    n = 0
    for where, rec in _committed_cells():
        if rec["status"] in ("ok", "unchecked"):
            check_rates(rec, where)
            check_rates(recount(rec), where + "recounted: ")
            n += 1
    assert n > 2000


def test_a_sharded_cells_percentages_are_of_its_devices_together():
    """8 H200s each at 60% of the bf16 peak: 60% of the peak and of the roofline, measured as written and as recounted
    (one device's peak would say 480%, faster than its own roofline)."""

    import attnlab.api.sharded  # noqa: F401  (registers the strategies a sharded cell names)
    from attnlab.measure.cell import Cell
    from attnlab.measure.outcome import rates

    cell = Cell("xla", 8, 8192, 8192, 32, 8, 128, "bfloat16", True, None, "fwd", 8, "ring")
    w = cell.workload
    ms = w.flops() / (8 * 0.6 * 989.4e12) * 1e3
    got = rates({"kernel_ms": ms, "flops": w.flops(), "bytes": w.bytes()}, cell,
                types.SimpleNamespace(kind="NVIDIA H200", platform="gpu"))
    assert got["pct_peak"] == pytest.approx(60) and got["pct_roofline"] == pytest.approx(60)
    assert got["roofline_ms"] == pytest.approx(0.6 * ms)
    rec = {**packed_record(), "packing": None, **cell.identity(), "devices": 8, "strategy": "ring", "kernel_ms": ms,
           "flops": w.flops(), "bytes": w.bytes(), **got}
    again = recount(rec)
    assert again["pct_peak"] == pytest.approx(60) and again["pct_roofline"] == pytest.approx(60)


def test_float64_is_stamped_with_fp32_s_peak_and_a_sharded_cell_rotates_past_each_device_s_l2(monkeypatch):
    from attnlab.core import device
    from attnlab.core.datasheet import dtype_class
    from attnlab.core.problem import Problem
    from attnlab.measure import Options, inputs

    assert (dtype_class("float64", tf32=True), dtype_class("float32", tf32=True)) == ("fp32", "tf32")
    monkeypatch.setattr(device, "current", lambda: types.SimpleNamespace(kind="NVIDIA H200"))
    w = Problem(8, 4096, 4096, 32, 8, 128, "bfloat16")      # a set (k, v, out): 403 MB; a device's eighth: 50 MB
    opts = Options(max_input_sets=64)
    assert inputs._set_count(w, opts) == 1 and inputs._set_count(w, opts, devices=8) == 4    # past 3 x 60 MiB of L2
