"""The estimate's check arithmetic is calibrated: a first cell whose check ran faster than estimated
scales the check of the estimates after it (``check_x``, stored with the rest of the calibration);
a calibration stored before ``check_x`` still loads; the float64 rows go at the rate measured here,
never below the slow-CPU floor (``attnlab.measure.calibration``, ``attnlab.measure.estimate``)."""
import dataclasses
import json

import pytest

from attnlab.core import device
from attnlab.measure import Cell, Options, calibration, estimate

CELL = Cell("xla", 1, 128, 128, 2, 2, 64, "float32", False)   # float64 rows under NUMPY_PROBE_FLOPS: no probe


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibration, "probe_s", lambda: 0.065)    # the CPU defaults' probe: scale x1, no compile
    calibration.forget()
    yield tmp_path
    calibration.forget()


@pytest.mark.parametrize("parts, x", [({"float64_rows_s": 0.01}, 0.1), (None, 1.0)])
def test_a_check_faster_than_estimated_scales_the_next_estimates_check(fresh, parts, x):
    info, opts = device.current(), Options()
    before = estimate.estimate_cell(CELL, opts, info).check_s
    raw = estimate.check_compute_s(CELL, opts, info)
    assert raw == pytest.approx(before)
    rec = {"status": "ok", "mode": "fwd", "compile_s": 0.5, "check_s": before / 10, "inputs_s": 0.1,
           "check_parts_s": parts}      # None: every reference was cached, the check made none
    cal = calibration.learn(rec, info, check_compute_s=raw)
    assert cal.check_x == pytest.approx(x)
    assert cal.problem_s == pytest.approx(0.1)    # a check faster than estimated holds no compile
    assert estimate.estimate_cell(CELL, opts, info).check_s == pytest.approx(before * x)
    assert estimate.check_compute_s(CELL, opts, info) == pytest.approx(raw)   # what learn compares: before check_x
    calibration.forget()      # a new process reads it back
    assert calibration.stored(info).check_x == pytest.approx(x)
    assert estimate.estimate_cell(CELL, opts, info).check_s == pytest.approx(before * x)


def test_a_calibration_stored_before_check_x_loads(fresh):
    info = device.current()
    key = info.kind or info.platform
    (fresh / "estimate.json").write_text(json.dumps({key: {"compile_s": 0.7, "problem_s": 0.4, "probe_s": 0.05,
                                                            "source": "measured here 2026-11-30 10:00 UTC"}}))
    assert calibration.stored(info) == calibration.Calibration(0.7, 0.4, "measured here 2026-11-30 10:00 UTC", 0.05, 1.0)


@pytest.mark.parametrize("text", ["[]", '"x"', "{KEY: []}", '{KEY: {"compile_s": NaN, "problem_s": 1}}',
                                  '{KEY: {"compile_s": 1, "problem_s": -1}}', '{KEY: {"compile_s": "1", "problem_s": 1}}',
                                  '{KEY: {"compile_s": 1, "problem_s": 1, "probe_s": Infinity}}'])
def test_a_corrupt_calibration_file_reads_as_none_and_is_written_anew(fresh, text):
    """Not an object of finite numbers >= 0: the defaults (no cell over budget, no crash storing the next one)."""
    info = device.current()
    key = info.kind or info.platform
    (fresh / "estimate.json").write_text(text.replace("KEY", json.dumps(key)))
    assert calibration.stored(info) == calibration.DEFAULTS[info.platform]
    assert not estimate.over_budget(CELL, Options(cell_budget_s=60), info)[1]
    calibration.forget()
    rec = {"status": "ok", "mode": "fwd", "compile_s": 0.5, "check_s": 0.2, "inputs_s": 0.1, "check_parts_s": None}
    cal = calibration.learn(rec, info, check_compute_s=0.0)
    assert json.loads((fresh / "estimate.json").read_text()) == {key: dataclasses.asdict(cal)}   # strict JSON: no NaN


def test_float64_rows_go_at_the_measured_rate_never_below_the_floor(monkeypatch):
    monkeypatch.setattr(calibration, "float64_gflops", lambda: 40.0)
    assert estimate.float64_rate(1e9) == pytest.approx(estimate.NUMPY_SHARE * 40e9)
    monkeypatch.setattr(calibration, "float64_gflops", lambda: 0.3)       # a loaded machine: the floor
    assert estimate.float64_rate(1e9) == pytest.approx(estimate.NUMPY_GFLOPS * 1e9)
    monkeypatch.setattr(calibration, "float64_gflops", lambda: pytest.fail("probed for rows too small to matter"))
    assert estimate.float64_rate(estimate.NUMPY_PROBE_FLOPS / 2) == pytest.approx(estimate.NUMPY_GFLOPS * 1e9)


def test_a_learnt_check_x_keeps_the_float64_rate_it_was_learnt_at(fresh, monkeypatch):
    info = device.current()
    calibration._FLOAT64[:] = [4.0]           # the rate this process's estimates used
    rec = {"status": "ok", "mode": "fwd", "compile_s": 0.5, "check_s": 1e-4, "check_parts_s": {"reference_s": 1e-4}}
    calibration.learn(rec, info, check_compute_s=1e-3)
    calibration.forget()                      # a new process, whose probe would say otherwise
    monkeypatch.setattr(calibration, "float64_gflops", lambda: 40.0)
    cal = calibration.current(info)
    assert (cal.check_x, cal.float64_gflops) == (pytest.approx(0.1), 4.0)
    assert estimate.float64_rate(1e9, cal) == pytest.approx(estimate.NUMPY_SHARE * 4e9)


def test_writers_at_once_keep_every_calibration_and_the_file_is_never_torn(fresh):
    """Two sweeps calibrating at once (a CPU's and a GPU's sharing the cache) wrote one temporary file: entries
    were lost and a reader saw invalid JSON."""
    import threading

    cal = calibration.Calibration(0.5, 0.1, "measured here", 0.05, 1.0)
    torn = []

    def write(i):
        for j in range(60):
            calibration._store(f"dev{i}-{j}", cal)

    def read():
        while any(t.is_alive() for t in writers):
            text = (fresh / "estimate.json").read_text() if (fresh / "estimate.json").exists() else "{}"
            try:
                json.loads(text)
            except ValueError:
                torn.append(text[:40])

    writers = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in writers:
        t.start()
    read()
    for t in writers:
        t.join()
    assert not torn and len(json.loads((fresh / "estimate.json").read_text())) == 240
