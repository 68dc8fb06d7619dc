"""The measuring engine's own cost: per-phase seconds, compile ahead, Ctrl-C within a second, estimates."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import pytest
from click.testing import CliRunner

from attnlab.cli import main
from attnlab.measure import Cell, Options, ahead, measure_cell
from attnlab.measure.phases import PHASES
from attnlab.core.records import COST_FIELDS, cost_summary
from attnlab.sweep import Sweep, build, engine, run_sweep

FAST = Options(repeats=2, warmup=1, pipelined_calls=3, max_input_sets=2, min_time_s=0.0)
TINY = ["bench", "--backends", "naive", "--seq", "16", "--heads", "2", "--head-dim", "8", "--dtype", "float32",
        "--repeats", "2", "--min-time", "0"]
COST_LINE = re.compile(r"^(\d+) cells in [\d.]+ s: compile [\d.]+ s, check [\d.]+ s, timing [\d.]+ s, other [\d.]+ s$", re.M)


def _dedupe(xs):
    return [x for i, x in enumerate(xs) if i == 0 or xs[i - 1] != x]


def test_a_cell_records_the_seconds_of_each_phase_and_announces_them_in_order():
    seen = []
    r = measure_cell(Cell("naive", 1, 32, 32, 2, 2, 8, "float32", True, mode="fwd+bwd"), FAST, on_phase=seen.append)
    assert r["status"] == "ok"
    assert _dedupe(seen) == list(PHASES)
    assert all(isinstance(r[f], float) and r[f] > 0 for f in COST_FIELDS), {f: r[f] for f in COST_FIELDS}
    assert r["inputs_s"] + r["check_s"] + r["timing_s"] < r["cell_s"]
    assert r["inputs_draw"] == "threefry-v1"


def test_cost_summary_sums_cells_and_skips_other_records():
    recs = [{"cell_s": 10.0, "compile_s": 2.0, "check_s": 3.0, "timing_s": 4.0},
            {"cell_s": 1.0, "compile_s": None, "check_s": None, "timing_s": 0.5, "kind": "cell"},
            {"kind": "lab_step", "cell_s": 99.0}]
    assert cost_summary(recs) == "2 cells in 11.0 s: compile 2.0 s, check 3.0 s, timing 4.5 s, other 1.5 s"


def test_bench_prints_the_estimate_first_and_the_cost_line_last(tmp_path):
    r = CliRunner().invoke(main, TINY + ["--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert re.search(r"^1 cells on cpu: estimated ~[\d.e+-]+ s a cell", r.output, re.M), r.output
    m = COST_LINE.search(r.output)
    assert m and m.group(1) == "1" and r.output.rstrip().endswith(m.group(0)), r.output
    rec = json.loads((tmp_path / "b" / "results.jsonl").read_text())
    assert all(rec[f] is not None for f in COST_FIELDS)
    header = (tmp_path / "b" / "results.csv").read_text().splitlines()[0].split(",")
    assert set(COST_FIELDS) <= set(header)


def test_a_cell_over_its_budget_is_recorded_with_the_estimate_and_not_run(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr("attnlab.measure.inputs.draw_sets", lambda *a: drawn.append(1))
    r = measure_cell(Cell("naive", 1, 32, 32, 2, 2, 8, "float32"), Options(cell_budget_s=1e-3))
    assert r["status"] == "over_budget" and not drawn
    assert "estimated ~" in r["reason"] and "cell budget of 0.001 s" in r["reason"] and r["estimate_s"] > 1e-3
    monkeypatch.undo()
    out = tmp_path / "b"
    r = CliRunner().invoke(main, TINY + ["--out", str(out), "--cell-budget", "0.001"])
    assert r.exit_code == 0, r.output
    assert "1 cell(s) over the cell budget of 0.001 s" in r.output
    assert json.loads((out / "results.jsonl").read_text())["status"] == "over_budget"
    # a resume with a budget that runs it measures it again: the verdict came from the budget, not the cell
    r = CliRunner().invoke(main, TINY + ["--out", str(out), "--resume"])
    assert r.exit_code == 0 and "already recorded" not in r.output, r.output
    assert [json.loads(x)["status"] for x in (out / "results.jsonl").read_text().splitlines()] == ["ok"]
    for flag, bad in (("--cell-budget", "0"), ("--cell-budget", "nan"), ("--compile-budget", "nan"),
                      ("--compile-budget", "-5"), ("--min-time", "inf")):
        r = CliRunner().invoke(main, TINY + ["--out", str(tmp_path / "c"), flag, bad])
        assert r.exit_code == 2 and "must be a finite number of seconds" in r.output, (flag, bad, r.output)


def test_a_resume_that_checks_measures_an_unchecked_cell_again(tmp_path):
    out = tmp_path / "b"
    assert CliRunner().invoke(main, TINY + ["--out", str(out), "--no-check"]).exit_code == 0
    assert CliRunner().invoke(main, TINY + ["--out", str(out), "--no-check", "--resume"]).exit_code == 0
    assert json.loads((out / "results.jsonl").read_text())["status"] == "unchecked"   # nothing new to learn
    assert CliRunner().invoke(main, TINY + ["--out", str(out), "--resume"]).exit_code == 0
    assert [json.loads(x)["status"] for x in (out / "results.jsonl").read_text().splitlines()] == ["ok"]


def test_the_estimate_refuses_a_70b_prefill_at_32k_on_a_cpu():
    """issue 23: on a CPU this cell ran for 12.5 min without finishing."""
    from attnlab.core import device
    from attnlab.measure.estimate import estimate_cell

    c = Cell("xla", 1, 32768, 32768, 64, 8, 128, "bfloat16", True)
    assert estimate_cell(c, Options(), device.current()).seconds > 120
    small = Cell("xla", 1, 256, 256, 4, 4, 64, "float32", True)
    assert estimate_cell(small, Options(), device.current()).seconds < 120




def test_a_cell_compiled_ahead_measures_as_one_compiled_in_place():
    c = Cell("naive", 1, 32, 32, 2, 2, 8, "float32", True, mode="fwd+bwd")
    fut = ahead.start(c)
    assert fut is not None
    r = measure_cell(c, FAST, compiled=fut)
    assert r["status"] == "ok" and r["compiled_ahead"] is True and r["compile_s"] > 0
    assert len(fut.result()) == 4    # fwd+bwd: the check's forward program compiled ahead too
    assert ahead.start(Cell("naive", 1, 32, 32, 2, 2, 8, "float32", mode="bwd")) is None
    assert ahead.why_not(Cell("cudnn", 1, 32, 32, 2, 2, 512, "bfloat16"))   # refused here: never compiled ahead


def test_a_failing_ahead_compile_is_that_cells_compile_error_only(tmp_path, fake_backend):
    def boom(p):
        raise ValueError("fake lowering failure")

    bad = fake_backend("fake-ahead-bad", boom)
    sweep = build({"backends": f"naive,{bad}", "seq": "16,32", "heads": "2", "head_dim": "8", "dtype": "float32"})
    recs = run_sweep(sweep, str(tmp_path / "a"), options=FAST)
    by = {(r["backend"], r["q_len"]): r for r in recs}
    assert [by[("naive", t)]["status"] for t in (16, 32)] == ["ok", "ok"]
    assert by[("naive", 32)]["compiled_ahead"] is True
    for t in (16, 32):
        assert by[(bad, t)]["status"] == "compile_error" and "fake lowering failure" in by[(bad, t)]["reason"]
    no_ahead = run_sweep(sweep, str(tmp_path / "b"), options=Options(**{**FAST.__dict__, "compile_ahead": False}))
    assert [(r["status"], r["reason"]) for r in no_ahead] == [(r["status"], r["reason"]) for r in recs]


def test_the_next_compile_finishes_before_this_cells_timing(tmp_path, monkeypatch):
    """The timer owns the device alone: XLA's GPU autotuner runs kernels while it compiles."""
    events, reached = [], threading.Event()   # reached: the first cell is at its timing, waiting or not
    real_wait = engine.wait

    def waiting(fs, timeout=None):
        reached.set()
        return real_wait(fs, timeout=timeout)

    def slow_start(cell, opts=None, after=None):
        fut = Future()

        def finish():
            reached.wait(120)
            time.sleep(1)   # a timer that did not wait (or not long enough) would have started by now
            events.append(f"ahead done {cell.q_len}")
            fut.set_exception(RuntimeError("compiled elsewhere"))
        threading.Thread(target=finish, daemon=True).start()
        return fut

    def on_phase(cell, p):
        if p == "timing":
            events.append(f"{p} {cell.q_len}")
            reached.set()

    monkeypatch.setattr(engine.ahead_compile, "start", slow_start)
    monkeypatch.setattr(engine, "wait", waiting)
    sweep = build({"backends": "naive", "seq": "16,32", "heads": "2", "head_dim": "8", "dtype": "float32"})
    run_sweep(sweep, str(tmp_path / "a"), options=FAST, on_phase=on_phase)
    assert events.index("ahead done 32") < events.index("timing 16")


SLOW_SWEEP = r"""
import signal, sys, time
import attnlab.measure.check as check
real = check.output_errors
def slow(out, q, *a, **kw):
    if q.shape[1] == 32:   # the second cell: its reference check is stuck in C code that ignores SIGINT
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
        print("SLOW", file=sys.stderr, flush=True)
        time.sleep(300)
    return real(out, q, *a, **kw)
check.output_errors = slow
from attnlab.cli import main
main(sys.argv[1:])
"""


def test_ctrl_c_inside_a_stuck_cell_exits_at_once_keeping_finished_cells(tmp_path):
    out = tmp_path / "o"
    args = ["bench", "--backends", "naive", "--seq", "16,32", "--heads", "2", "--head-dim", "8", "--dtype",
            "float32", "--repeats", "2", "--min-time", "0", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, ["src", os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SWEEP, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        if "SLOW" in line:
            break
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        stdout, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("Ctrl-C did not stop a sweep stuck in a cell within 30 s")
    assert time.monotonic() - t0 < 10   # the stuck cell would take 300 s
    assert proc.returncode == 130, stdout
    assert "1 of 2 cells finished" in stdout and "--resume" in stdout, stdout
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["q_len"], r["status"]) for r in recs] == [(16, "ok")]
    assert (out / "results.csv").exists()


def test_the_recorded_draw_threefry_v1_is_the_draw_of_earlier_records():
    """Keys are now cached per seed; the values are those every earlier record was measured on."""
    import jax
    import numpy as np

    from attnlab.reference.inputs import _normal, cotangent, random_qkv

    kq, kk, kv = jax.random.split(jax.random.key(3), 3)
    want = (_normal(kq, (1, 16, 2, 8)), _normal(kk, (1, 24, 2, 8)), _normal(kv, (1, 24, 2, 8)))
    for _ in range(2):   # the second call reads the cached keys
        got = random_qkv(1, 16, 24, 2, 2, 8, "float32", seed=3)
        assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, want))
    assert np.array_equal(np.asarray(cotangent(103, (1, 16, 2, 8))),
                          np.asarray(jax.random.normal(jax.random.key(103), (1, 16, 2, 8))))


def test_a_paged_cell_after_another_is_not_compiled_ahead_from_q_k_v(tmp_path):
    """A paged cell's program takes (q, pages, table): compiled ahead from (q, k, v) shapes it failed."""
    sweep = Sweep(["attnlab-decode"], batch=[2], q_len=[1], kv_len=[64], heads=[4], kv_heads=[2], head_dim=[32],
                  dtype=["float32"], causal=[True], lengths=["full", "paged16"])
    recs = run_sweep(sweep, str(tmp_path), options=Options(repeats=1, warmup=0))
    assert [r["status"] for r in recs] == ["ok", "ok"], [r["reason"] for r in recs]
    assert "paged" in ahead.why_not(sweep.cells()[1])


def test_no_timing_or_exit_beside_a_compile_abandoned_past_its_budget(tmp_path, monkeypatch):
    """A compile past its budget is skipped but cannot be stopped: the next cell's timer ran beside it, and a sweep
    returned with it inside XLA (the interpreter then aborts at exit, 134)."""
    from attnlab.measure import budget, threads, timers

    real = timers.compile_seconds
    slow = {"naive": 2.0}

    def compile_seconds(timed, args):
        out = real(timed, args)
        if threading.current_thread().name == "attnlab-compile":    # a cell's own compile (not a probe's, a check's)
            time.sleep(slow.pop("naive", 0.0))      # the first (naive's) runs past its budget (1.5 s: a busy CI's compile fits)
        return out

    monkeypatch.setattr(budget.timers, "compile_seconds", compile_seconds)
    overlaps = []
    real_time_into = timers.time_into

    def time_into(*a, **kw):
        overlaps.extend(b.thread.name for b in threads.running() if b.thread.name.startswith(threads.COMPILE_NAMES))
        return real_time_into(*a, **kw)

    monkeypatch.setattr(timers, "time_into", time_into)
    sweep = build({"backends": "naive,xla", "seq": "16", "heads": "2", "head_dim": "8", "dtype": "float32"})
    recs = run_sweep(sweep, str(tmp_path / "s"), options=Options(**{**FAST.__dict__, "compile_budget_s": 1.5,
                                                                     "compile_ahead": False}))
    assert [r["status"] for r in recs] == ["over_budget", "ok"] and "--compile-budget" in recs[0]["reason"]
    assert not overlaps and not [b for b in threads.running() if b.thread.name.startswith(threads.COMPILE_NAMES)]
    assert recs[1]["next_compile_wait_s"] > 0.1          # xla's timing waited for naive's compile to end
    slow["naive"] = 2.0                                  # a sweep of that cell alone: it returns after the compile
    one = build({"backends": "naive", "seq": "16", "heads": "2", "head_dim": "8", "dtype": "float32"})
    assert [r["status"] for r in run_sweep(one, str(tmp_path / "one"), options=Options(
        **{**FAST.__dict__, "compile_budget_s": 1.5}))] == ["over_budget"]
    assert not [b for b in threads.running() if b.thread.name.startswith(threads.COMPILE_NAMES)]


def test_a_pipe_gets_no_torn_progress_and_names_are_text(tmp_path):
    """In a pipe the bar's last frame was left behind; rich turned ":x:" in a name or path into an emoji."""
    r = CliRunner().invoke(main, TINY + ["--out", str(tmp_path / "b")])       # CliRunner's output is no terminal
    assert r.exit_code == 0 and "━" not in r.output and "ETA" not in r.output, r.output
    r = CliRunner().invoke(main, ["bench", "--backends", ":x:", "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "unknown backend ':x:'" in r.output and "❌" not in r.output, r.output
    r = CliRunner().invoke(main, ["bench", "--model", "", "--out", str(tmp_path / "d")])
    assert r.exit_code == 2 and "model: '' is no preset" in r.output, r.output
