"""Declarative sweeps, the CLI, results files, resume after SIGKILL, compare's exit codes."""
import json
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from attnlab.cli import main
from attnlab.sweep import SweepError, build, load_toml
from attnlab.sweep.compare import compare

ISSUE_ARGS = ["bench", "--backends", "naive,xla", "--batch", "1,2", "--seq", "64,128", "--heads", "4", "--kv-heads", "2",
              "--head-dim", "32", "--dtype", "float32,bfloat16", "--causal", "both"]


def test_issue_command_writes_32_cells(tmp_path):
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ISSUE_ARGS + ["--out", str(out), "--repeats", "2", "--min-time", "0"])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 32 and all(x["status"] == "ok" for x in recs)
    assert len({json.dumps([x[k] for k in ("backend", "batch", "q_len", "dtype", "causal")]) for x in recs}) == 32
    for x in recs:
        assert x["env"]["jax"] and x["env"]["platform"] == "cpu" and "xla_flags" in x["env"]
    csv = (out / "results.csv").read_text().splitlines()
    assert len(csv) == 33 and csv[0].startswith("backend,batch,q_len")
    assert "naive" in r.output and "ms · FLOP/s" in r.output and "FLOP/s ·" in r.output


def test_sweep_axes():
    s = build({"backends": "xla", "seq": "64,128", "heads": "8", "kv_heads": "8,2,3", "causal": "both"})
    cells = s.cells()
    assert len(cells) == 2 * 2 * 2  # kv_heads=3 does not divide 8 and is dropped
    assert all(c.q_len == c.kv_len for c in cells)
    s = build({"backends": ["xla"], "q_len": [1], "kv_len": [4096, 32768], "heads": 32, "kv_heads": 8, "head_dim": 128})
    assert [(c.q_len, c.kv_len) for c in s.cells()] == [(1, 4096), (1, 32768)]
    s = build({"backends": "xla", "seq": "256,1024", "tokens": 4096})
    assert [(c.batch, c.q_len) for c in s.cells()] == [(16, 256), (4, 1024)]
    s = build({"backends": "xla", "window": "none,128:0,16", "mode": "fwd,fwd+bwd,bwd"})
    assert {c.window for c in s.cells()} == {None, (128, 0), (16, 16)} and len(s.cells()) == 9


@pytest.mark.parametrize("values,words", [
    ({"backends": "nope"}, "unknown backend 'nope'"),
    ({"backends": "xla", "seq": "-5"}, "seq: -5"),
    ({"backends": "xla", "seq": "abc"}, "seq: 'abc' is not an integer"),
    ({"backends": "xla", "dtype": "int8"}, "dtype: unknown dtype 'int8'"),
    ({"backends": "xla", "mode": "sideways"}, "mode: 'sideways'"),
    ({"backends": "xla", "causal": "maybe"}, "causal: 'maybe'"),
    ({"backends": "xla", "window": "1:2:3"}, "window"),
    ({"backends": "xla", "seq": "8", "q_len": "8"}, "either seq"),
    ({"backends": "xla", "heads": "3", "kv_heads": "2"}, "no valid cell: every combination of the axes breaks a rule: heads: heads must be a multiple of kv_heads"),
    ({"backends": "xla", "heads": "2", "kv_len": "64", "q_len": "1", "lengths": "paged7"},
     "lengths: decode and serving cells need q_len <= kv_len, no strategy and a page size dividing kv_len"),
    ({"backends": "xla", "kv_len": "64", "q_len": "1", "lengths": "uniform", "causal": "true", "prefill_chunks": "2x5000"},
     "breaks a rule: prefill_chunks: prefill chunks need serving lengths and a chunk size <= kv_len"),
    ({"backends": "xla", "colour": "red"}, "unknown sweep key"),
    ({"seq": "8"}, "backends"),
    ({"backends": "xla", "inputs": "gaussian,cauchy"}, "inputs: 'cauchy'"),
    ({"backends": "xla", "seq": "16,16"}, "seq: 16 given twice; give each value once"),
    ({"backends": "xla", "q_len": [8, 8], "kv_len": [8]}, "q_len: 8 given twice"),
    ({"backends": "xla", "dtype": "f32,float32"}, "dtype: float32 given twice"),     # as the cells read them
    ({"backends": "xla", "mode": "fwd,fwd"}, "mode: fwd given twice"),
    ({"backends": "xla,XLA"}, "backends: xla given twice"),
    ({"backends": "xla", "causal": [True, True]}, "causal: true given twice"),
    ({"backends": "xla", "window": "16,16:16"}, "window: 16:16 given twice"),
    ({"backends": "xla", "lengths": "full,FULL"}, "lengths: full given twice"),
    ({"backends": "xla", "kv_dtype": "fp8,float8_e4m3fn:token", "lengths": "full"}, "kv_dtype: float8_e4m3fn:token given twice"),
    ({"backends": "xla", "inputs": "gaussian,Gaussian"}, "inputs: gaussian given twice"),
    ({"backends": "xla", "seq": "16,32", "tokens": 16}, "tokens: 16 is less than q_len 32: batch = tokens // q_len"),
    ({"backends": "xla", "window": "99999999999:0"}, "window: 99999999999:0: each side must be at most 2**30"),
    ({"backends": "xla", "dtype": ""}, "dtype: no values (leave it out for its default)"),
    ({"backends": "xla", "prefill_chunks": ","}, "prefill_chunks: no values"),
    ({"backends": "xla", "seq": "3000000000"}, "batch x sequence: 1 x 3000000000 tokens is more than 2**28"),
    ({"backends": "xla", "batch": "300000000"}, "batch x sequence: 300000000 x 128 tokens is more than 2**28"),
    ({"backends": "xla", "lengths": "spread", "causal": "true", "kv_len": "32", "q_len": "1",
      "prefill_chunks": "300000000x1"}, "requests (batch + prefill chunks) x sequence: 300000001 x 32 tokens is more"),
])
def test_bad_sweep_values(values, words):
    with pytest.raises(SweepError) as e:
        build(values)
    assert words in str(e.value)


def test_toml_config(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('[sweep]\nbackends = ["naive", "xla"]\nseq = [32]\nheads = [2]\nhead_dim = [8]\n'
                 'dtype = ["float32"]\ncausal = "both"\nwindow = ["none", [4, 0]]\n[run]\nrepeats = 2\n')
    values, run = load_toml(p)
    assert run == {"repeats": 2}
    assert len(build(values).cells()) == 2 * 2 * 2
    r = CliRunner().invoke(main, ["bench", "--config", str(p), "--out", str(tmp_path / "o"), "--dtype", "bfloat16"])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in (tmp_path / "o" / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 8 and {x["dtype"] for x in recs} == {"bfloat16"}


@pytest.mark.parametrize("text,words", [
    ("[sweep\nbackends=1", "not valid TOML"),
    ("[other]\nx=1", "no [sweep] table"),
    ('[sweep]\nbackends=["xla"]\n[run]\nspeed=3', "unknown [run] key"),
    ('[sweep]\nbackends=["xla"]\n[extra]\n', "unknown table"),
])
def test_bad_config_files(tmp_path, text, words):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    r = CliRunner().invoke(main, ["bench", "--config", str(p), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("args,words", [
    (["--backends", "naive", "--seq", "-5"], "seq: -5"),
    (["--backends", "naive", "--dtype", "float7"], "float7"),
    (["--backends", "warp"], "warp"),
    (["--backends", "naive", "--config", "/does/not/exist.toml"], "not found"),
    (["--backends", "naive", "--repeats", "0"], "repeats"),
])
def test_bad_cli_arguments_exit_nonzero_without_traceback(tmp_path, args, words):
    r = CliRunner().invoke(main, ["bench", *args, "--out", str(tmp_path / "o")])
    assert r.exit_code != 0 and words in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("command", ["bench", "tune"])
@pytest.mark.parametrize("args,words", [
    (["--seq", "16,16"], "seq: 16 given twice"),
    (["--seq", "16", "--dtype", "f32,float32"], "dtype: float32 given twice"),
    (["--seq", "16", "--mode", "fwd,fwd"], "mode: fwd given twice"),
    (["--seq", "16", "--tokens", "8"], "tokens: 8 is less than q_len 16"),
    (["--seq", "16", "--window", "99999999999:0"], "window: 99999999999:0: each side must be at most"),
])
def test_axis_values_are_refused_up_front(tmp_path, monkeypatch, command, args, words):
    """One line and exit 2 before any cell runs: a value given twice (a cell measured twice), tokens < q_len
    (batch = tokens // q_len would be 0), a window side past 2**30 (it overflows the int32 positions)."""
    import attnlab.sweep
    monkeypatch.setattr(attnlab.sweep, "run_sweep", lambda *a, **k: pytest.fail("ran a sweep"))
    out = ["--out", str(tmp_path / ("o" if command == "bench" else "d.json"))]
    r = CliRunner().invoke(main, [command, "--backends", "naive,xla", "--heads", "2", "--head-dim", "8", *args, *out])
    (line,) = r.output.strip().splitlines()
    assert r.exit_code == 2 and line.startswith("error: ") and words in line, r.output


KILL_CELLS = 16


def _bench_cmd(out):
    return [sys.executable, "-m", "attnlab.cli", "bench", "--backends", "naive,xla", "--batch", "1,2",
            "--seq", "16,32", "--heads", "2", "--head-dim", "8", "--dtype", "float32", "--causal", "both",
            "--repeats", "2", "--min-time", "0", "--out", str(out)]   # 2 x 2 x 2 x 2 = KILL_CELLS


def test_resume_after_sigkill_loses_and_duplicates_nothing(tmp_path):
    out = tmp_path / "k"
    path = out / "results.jsonl"
    proc = subprocess.Popen(_bench_cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= 6:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = path.read_text().splitlines()
    assert 6 <= len(partial) < KILL_CELLS, "the sweep should have been killed mid-way"
    with open(path, "a") as f:
        f.write('{"backend": "naive", "batch": 1, "q_len"')   # a line torn by the kill
    r = subprocess.run(_bench_cmd(out) + ["--resume"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    keys = [json.dumps([x[k] for k in ("backend", "batch", "q_len", "causal")]) for x in recs]
    assert len(recs) == KILL_CELLS and len(set(keys)) == KILL_CELLS
    assert recs[: len(partial)] == [json.loads(x) for x in partial]   # finished cells kept, not re-measured


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _rec(ms, backend="xla", status="ok"):
    return {"backend": backend, "batch": 1, "q_len": 64, "kv_len": 64, "heads": 4, "kv_heads": 4, "head_dim": 32,
            "dtype": "bfloat16", "causal": False, "window": None, "mode": "fwd", "status": status,
            "reason": None if status == "ok" else status, "kernel_ms": ms if status == "ok" else None,
            "wall_ms": ms * 2 if status == "ok" else None, "timer": "cupti"}


def test_compare_exit_codes(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    _write(a, [_rec(1.0), _rec(2.0, "naive")])
    _write(b, [_rec(1.03), _rec(2.0, "naive")])
    _write(c, [_rec(1.2), _rec(2.0, "naive", status="oom")])
    run = CliRunner().invoke
    assert run(main, ["compare", str(a), str(b)]).exit_code == 0            # 3% < 5%
    r = run(main, ["compare", str(a), str(b), "--threshold", "1"])
    assert r.exit_code == 1 and "SLOWER" in r.output
    r = run(main, ["compare", str(a), str(c)])
    assert r.exit_code == 1 and "status" in r.output
    assert run(main, ["compare", str(a), str(tmp_path / "missing.jsonl")]).exit_code != 0
    rows, regressed = compare([_rec(1.0)], [_rec(0.5)])
    assert not regressed and rows[0].ratio == 0.5


# --- compare: noise is not a regression (issue 12, item 4) ---------------------------------------

def _timed(ms, lo, p75, backend="xla", q_len=64, **extra):
    r = _rec(ms, backend)
    r.update(q_len=q_len, kv_len=q_len, kernel_min_ms=lo, kernel_p25_ms=lo, kernel_p75_ms=p75, kernel_max_ms=p75 * 1.1,
             **extra)
    return r


@pytest.mark.parametrize("a,b,verdict", [
    ((1.0, 0.90, 1.10), (1.08, 0.95, 1.15), "same"),     # medians 8% apart, spreads overlap: noise
    ((1.0, 0.99, 1.00), (1.20, 1.02, 1.25), "same"),     # B's fastest call within the threshold of A's median
    ((1.0, 0.98, 1.01), (1.30, 1.28, 1.32), "slower"),   # apart in every way: a regression
    ((1.3, 1.28, 1.32), (1.0, 0.98, 1.01), "faster"),
    ((1.0, 0.98, 1.20), (1.10, 1.08, 1.12), "same"),     # B.min above A's median by 8% but inside A's [min, p75]
])
def test_compare_needs_the_spreads_apart(a, b, verdict):
    from attnlab.sweep.compare import counts

    rows, regressed = compare([_timed(*a)], [_timed(*b)], 5.0)
    assert rows[0].verdict == verdict and regressed == (verdict == "slower")
    assert counts(rows)[verdict] == 1


def test_compare_prints_counts_and_exit_codes(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(a, [_timed(1.0, 0.9, 1.1), _timed(1.0, 0.98, 1.01, q_len=128), _timed(1.0, 0.98, 1.01, q_len=256),
               _timed(1.0, 0.98, 1.01, q_len=512)])
    _write(b, [_timed(1.05, 0.95, 1.1), _timed(0.5, 0.49, 0.51, q_len=128), _timed(1.3, 1.28, 1.32, q_len=256),
               _timed(1.0, 0.98, 1.01, q_len=1024)])
    r = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert r.exit_code == 1, r.output
    assert "faster: 1" in r.output and "same: 1" in r.output and "slower: 1" in r.output
    assert "only in A: 1" in r.output and "only in B: 1" in r.output and "[min, p75]" in r.output
    r = CliRunner().invoke(main, ["compare", str(a), str(a)])
    assert r.exit_code == 0 and "slower: 0" in r.output and "same: 4" in r.output


def test_compare_reads_older_files_without_p75(tmp_path):
    from attnlab.core.records import timing

    old = _rec(1.0)
    old.update(kernel_min_ms=0.9, kernel_max_ms=1.5, kernel_iqr_ms=0.2)   # schema-2 files before p25/p75
    t = timing(old)
    assert t["spread"] == "estimated" and t["min"] == 0.9 and t["p75"] == pytest.approx(1.2)
    assert timing(_rec(2.0))["spread"] == "none"
    rows, regressed = compare([old], [_timed(1.1, 1.06, 1.12)])
    assert rows[0].verdict == "same" and not regressed   # 1.06 < A's p75 bound 1.2


def _run_folder(path, ms):
    """The layout of an ``attnlab run`` folder: lab_step records, cells tagged with their step (the same
    cell measured by two steps), memory records without kv_len."""
    cell = dict(_timed(ms, ms * 0.98, ms * 1.01), kind="cell")
    path.mkdir()
    _write(path / "results.jsonl", [
        {"kind": "lab_step", "step": "environment", "title": "1.", "status": "ok", "reason": None},
        dict(cell, step="timing"), dict(cell, step="seq_sweep"),
        {"kind": "memory", "step": "next", "backend": "xla", "q_len": 64, "batch": 1, "status": "ok", "reason": None,
         "temp_bytes": 10},
        {"kind": "lab_step", "step": "next", "title": "11.", "status": "ok", "reason": None},
    ])


def test_compare_two_run_folders(tmp_path):
    _run_folder(tmp_path / "a", 1.0)
    _run_folder(tmp_path / "b", 1.0)
    _run_folder(tmp_path / "c", 2.0)
    r = CliRunner().invoke(main, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert "same: 2" in r.output and "[timing]" in r.output and "[seq_sweep]" in r.output
    r = CliRunner().invoke(main, ["compare", str(tmp_path / "a"), str(tmp_path / "c")])
    assert r.exit_code == 1 and "slower: 2" in r.output


@pytest.mark.parametrize("content,words", [
    ("this is not json\n{also not\n", "line 1 is not a JSON record"),
    ("[1, 2]\n", "line 1 is not a JSON record"),
    ('{"kind": "lab_step", "step": "x", "status": "ok"}\n', "no cell records"),
    ("", "no cell records"),
    ('{"backend": "xla", "batch": "one"}\n', "batch"),
])
def test_compare_unreadable_is_exit_2(tmp_path, content, words):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(a, [_timed(1.0, 0.9, 1.1)])
    b.write_text(content)
    for args in ([str(a), str(b)], [str(b), str(a)]):
        r = CliRunner().invoke(main, ["compare", *args])
        assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output
    b.write_bytes(b"\xff\xfe\x00binary")
    r = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_compare_nothing_in_common_is_exit_2(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(a, [_timed(1.0, 0.9, 1.1, q_len=64)])
    _write(b, [_timed(1.0, 0.9, 1.1, q_len=128)])
    r = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert r.exit_code == 2 and "no cell in common" in r.output



def test_compare_nothing_comparable_is_exit_2(tmp_path):
    """Cells in common but none comparable (timers differ, or not timed on either side): exit 2, not a pass."""
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    _write(a, [_timed(1.0, 0.9, 1.1), _rec(1.0, "naive", status="oom")])
    _write(b, [dict(_timed(1.0, 0.9, 1.1), timer="wall"), _rec(1.0, "naive", status="oom")])
    _write(c, [_timed(1.0, 0.9, 1.1), _rec(1.0, "naive", status="oom")])
    r = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert r.exit_code == 2 and "nothing comparable" in r.output and "not comparable: 2" in r.output, r.output
    assert CliRunner().invoke(main, ["compare", str(a), str(c)]).exit_code == 0   # one cell judged is enough


def _unchecked(ms, lo, p75, **extra):
    r = _timed(ms, lo, p75, **extra)
    r.update(status="unchecked")
    return r


@pytest.mark.parametrize("b,verdict", [((1.0, 0.9, 1.1), "same"), ((0.5, 0.49, 0.51), "faster"),
                                       ((1.3, 1.28, 1.32), "slower")])
def test_compare_ok_against_unchecked_compares_the_times(tmp_path, b, verdict):
    """B ran with --no-check: its cells are unchecked but timed by the same timer, so they are judged."""
    rows, regressed = compare([_timed(1.0, 0.98, 1.01)], [_unchecked(*b)], 5.0)
    assert rows[0].verdict == verdict and rows[0].ratio == pytest.approx(b[0]) and regressed == (verdict == "slower")
    assert "status A=ok B=unchecked" in rows[0].note
    rows, _ = compare([_unchecked(*b)], [_unchecked(*b)], 5.0)
    assert rows[0].verdict == "same" and rows[0].note == ""
    pa, pb = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(pa, [_timed(1.0, 0.98, 1.01)])
    _write(pb, [_unchecked(*b)])
    r = CliRunner().invoke(main, ["compare", str(pa), str(pb)])
    assert r.exit_code == (1 if verdict == "slower" else 0) and "unchecked" in r.output, r.output


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
def test_compare_threshold_must_be_finite_and_not_negative(tmp_path, value):
    """nan or inf would turn regression detection off (every comparison with nan is False)."""
    a = tmp_path / "a.jsonl"
    _write(a, [_timed(1.0, 0.98, 1.01)])
    r = CliRunner().invoke(main, ["compare", str(a), str(a), "--threshold", value])
    assert r.exit_code == 2 and "--threshold" in r.output and "finite" in r.output, r.output

def test_compare_real_back_to_back_cpu_runs_are_not_slower(tmp_path):
    """Two identical tiny CPU sweeps, one after the other: wall clock is noisy, none is SLOWER.

    A shared machine can really be slower for a whole run, or lucky in one run's spread (CI once saw every cell
    1.5x slower, spreads apart), so up to five pairs of back-to-back runs are compared (each run against the one
    before it): a compare that flags identical runs every time still fails."""
    args = ["bench", "--backends", "naive,xla", "--seq", "32,64", "--heads", "2", "--head-dim", "16",
            "--dtype", "float32", "--causal", "both"]
    outputs = []
    for i in range(6):
        r = CliRunner().invoke(main, args + ["--out", str(tmp_path / str(i))])
        assert r.exit_code == 0, r.output
        if i == 0:
            recs = [json.loads(x) for x in (tmp_path / "0" / "results.jsonl").read_text().splitlines()]
            assert all(x["wall_p75_ms"] >= x["wall_ms"] >= x["wall_min_ms"] > 0 for x in recs)
            continue
        r = CliRunner().invoke(main, ["compare", str(tmp_path / str(i - 1)), str(tmp_path / str(i))])
        if r.exit_code == 0 and "SLOWER" not in r.output and "slower: 0" in r.output:
            return
        outputs.append(r.output)
    raise AssertionError("\n".join(outputs))


# --- bench: never erase results silently; Ctrl-C keeps what finished (item 6) --------------------

TINY = ["bench", "--backends", "xla", "--seq", "16,32", "--heads", "2", "--head-dim", "8", "--dtype", "float32",
        "--repeats", "2", "--min-time", "0"]


def test_bench_refuses_to_erase_results(tmp_path):
    out = tmp_path / "o"
    run = CliRunner().invoke
    assert run(main, TINY + ["--out", str(out)]).exit_code == 0
    before = (out / "results.jsonl").read_text()
    r = run(main, TINY + ["--out", str(out)])
    assert r.exit_code == 2 and "--resume" in r.output and "--overwrite" in r.output
    assert (out / "results.jsonl").read_text() == before
    r = run(main, TINY + ["--out", str(out), "--resume", "--overwrite"])
    assert r.exit_code == 2 and "--resume and --overwrite" in r.output
    r = run(main, TINY + ["--out", str(out), "--resume"])
    assert r.exit_code == 0 and "skipped 2 of 2 cells" in r.output and (out / "results.jsonl").read_text() == before
    r = run(main, TINY + ["--out", str(out), "--overwrite"])
    assert r.exit_code == 0 and len((out / "results.jsonl").read_text().splitlines()) == 2
    assert (out / "results.jsonl").read_text() != before


def test_bench_ctrl_c_writes_csv_and_prints_resume(tmp_path, monkeypatch):
    from attnlab.sweep import engine

    real, calls = engine.measure_cell, []

    def interrupted_after_3(cell, opts=None, **kw):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(cell)
        return real(cell, opts, **kw)

    monkeypatch.setattr(engine, "measure_cell", interrupted_after_3)
    out = tmp_path / "o"
    r = CliRunner().invoke(main, TINY + ["--causal", "both", "--out", str(out)])
    assert r.exit_code == 130, r.output
    assert "3 of 4 cells" in r.output and "--resume" in r.output and "attnlab bench" in r.output
    assert len((out / "results.csv").read_text().splitlines()) == 1 + 3
    resume = r.output[r.output.index("attnlab bench"):].split("\n")[0].split()
    monkeypatch.setattr(engine, "measure_cell", real)
    r = CliRunner().invoke(main, resume[1:])
    assert r.exit_code == 0, r.output
    assert "skipped 3 of 4 cells" in r.output and len((out / "results.jsonl").read_text().splitlines()) == 4


# --- contradictory flags, windows as jax.nn reads them (item 7) -----------------------------------

@pytest.mark.parametrize("args,names", [
    (["--seq", "64", "--q-len", "32"], ("--seq", "--q-len")),
    (["--seq", "64", "--kv-len", "128"], ("--seq", "--kv-len")),
    (["--tokens", "1024", "--batch", "2"], ("--tokens", "--batch")),
])
def test_contradictory_flags_are_refused(tmp_path, args, names):
    r = CliRunner().invoke(main, ["bench", "--backends", "xla", *args, "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and all(n in r.output for n in names) and "contradict" in r.output
    assert not (tmp_path / "o").exists()


def test_config_conflicts(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('[sweep]\nbackends = ["xla"]\ntokens = 64\nbatch = [2]\n')
    r = CliRunner().invoke(main, ["bench", "--config", str(p), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "tokens" in r.output and "batch" in r.output
    p.write_text('[sweep]\nbackends = ["xla"]\nq_len = [16]\nkv_len = [32]\nbatch = [2]\nheads = [2]\nhead_dim = [8]\n'
                 'dtype = ["float32"]\n[run]\nrepeats = 2\nmin_time = 0\n')
    r = CliRunner().invoke(main, ["bench", "--config", str(p), "--seq", "16", "--tokens", "64", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "--seq replaces q_len" in r.output and "--tokens replaces batch" in r.output
    recs = [json.loads(x) for x in (tmp_path / "o" / "results.jsonl").read_text().splitlines()]
    assert [(x["batch"], x["q_len"], x["kv_len"]) for x in recs] == [(4, 16, 16)]


def test_window_int_is_symmetric_as_jax_reads_it():
    import inspect

    import jax

    from attnlab.core.workload import Workload

    assert "symmetric window (window_size, window_size)" in " ".join(inspect.getdoc(jax.nn.dot_product_attention).split())
    s = build({"backends": "xla", "seq": "64", "window": "8,8:0"})
    assert [c.window for c in s.cells()] == [(8, 8), (8, 0)]
    w = Workload(1, 64, 64, 1, 1, 8, "float32", window=(8, 8))
    assert w.kept_pairs() == sum(min(63, t + 8) - max(0, t - 8) + 1 for t in range(64))   # 2W+1 keys inside
    r = CliRunner().invoke(main, ["bench", "--help"])
    assert "(W, W)" in " ".join(r.output.split()) and "local_window_size" in r.output


def test_inputs_axis_records_and_separates_references(tmp_path):
    """--inputs: one cell per distribution, recorded, each checked against its own reference."""
    import numpy as np

    from attnlab.reference.distributions import make_qkv
    from attnlab.measure.check import ref_key
    from attnlab.reference.inputs import draw_sets, random_qkv

    s = build({"backends": "xla", "seq": "16", "heads": "2", "head_dim": "16", "inputs": "gaussian,Outliers"})
    assert [c.inputs for c in s.cells()] == ["gaussian", "outliers"]
    g, o = s.cells()
    assert ref_key(g, 0) != ref_key(o, 0) and "outliers" in o.config_label
    (q, k, v), = draw_sets(g.inputs, 1, 16, 16, 2, 2, 16, g.dtype, [0])
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip((q, k, v), random_qkv(1, 16, 16, 2, 2, 16, "bfloat16", 0)))
    (q, k, v), = draw_sets("channel-outliers", 1, 16, 16, 2, 2, 16, g.dtype, [0])
    want = make_qkv("channel-outliers", 1, 16, 16, 2, 2, 16, "float32", 0)
    assert np.array_equal(np.asarray(q.astype("float32")), want[0].astype("bfloat16").astype("float32"))
    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["bench", "--backends", "xla", "--seq", "16", "--heads", "2", "--head-dim", "16",
                                  "--dtype", "float32", "--inputs", "gaussian,shifted-keys", "--out", str(out),
                                  "--repeats", "1", "--min-time", "0"])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [x["inputs"] for x in recs] == ["gaussian", "shifted-keys"] and all(x["status"] == "ok" for x in recs)
    assert (out / "results.csv").read_text().splitlines()[0].split(",").count("inputs") == 1


# --- a flag replaces the file's value of its axis, and says so (issue 23 item 6) ----------------------

AXIS_FLAGS = [("backends", "backends", '["naive"]', "xla"), ("backends", "backend", '["naive"]', "xla"),
              ("batch", "batch", "[1]", "2"), ("seq", "seq", "[32, 64]", "16"), ("q_len", "q_len", "[8]", "16"),
              ("kv_len", "kv_len", "[8]", "16"), ("heads", "heads", "[4]", "2"), ("kv_heads", "kv_heads", "[1]", "2"),
              ("head_dim", "head_dim", "[8]", "4"), ("dtype", "dtype", '["bfloat16"]', "float32"),
              ("causal", "causal", '"both"', "true"), ("window", "window", '["none"]', "4:0"),
              ("mode", "mode", '["fwd+bwd"]', "fwd"), ("inputs", "inputs", '["outliers"]', "gaussian"),
              ("tokens", "tokens", "512", "256"), ("lengths", "lengths", '["full"]', "none")]


@pytest.mark.parametrize("axis,key,file_value,flag_value", AXIS_FLAGS)
def test_every_axis_flag_replaces_the_file_value_and_says_so(tmp_path, axis, key, file_value, flag_value):
    from attnlab.sweep.flags import flag_name, merge

    p = tmp_path / "s.toml"
    base = {"backends": '["naive"]', "heads": "[2]", "head_dim": "[4]"}
    base = {k: v for k, v in base.items() if k not in (axis, key)}
    p.write_text("[sweep]\n" + "".join(f"{k} = {v}\n" for k, v in {**base, key: file_value}.items()))
    values, _, notes = merge(str(p), {axis: flag_value})
    assert values[axis] == flag_value and key not in (set(values) - {axis})
    assert any(n.startswith(f"{flag_name(axis)} replaces {key} = {file_value}") and n.endswith(flag_value)
               for n in notes), notes
    build(values)


def test_seq_flag_over_the_file_seq_is_said(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('[sweep]\nbackends = ["naive"]\nseq = [32, 64]\nheads = [2]\nhead_dim = [4]\ndtype = ["float32"]\n'
                 '[run]\nrepeats = 1\nmin_time = 0\n')
    r = CliRunner().invoke(main, ["bench", "--config", str(p), "--seq", "16", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "--seq replaces seq = [32, 64]" in r.output
    recs = [json.loads(x) for x in (tmp_path / "o" / "results.jsonl").read_text().splitlines()]
    assert [x["q_len"] for x in recs] == [16]


def test_run_table_warmup_reaches_the_measurement(tmp_path, monkeypatch):
    """[run] warmup was accepted and then ignored; now it sets the untimed calls (and a bad one is refused)."""
    import attnlab.sweep

    seen = {}

    def capture(sweep, out, **kw):
        seen["opts"] = kw["options"]
        raise SweepError("captured")

    monkeypatch.setattr(attnlab.sweep, "run_sweep", capture)
    p = tmp_path / "s.toml"
    p.write_text('[sweep]\nbackends = ["naive"]\n[run]\nwarmup = 0\n')
    r = CliRunner().invoke(main, ["bench", "--config", str(p), "--out", str(tmp_path / "o")])
    assert "captured" in r.output and seen["opts"].warmup == 0
    p.write_text('[sweep]\nbackends = ["naive"]\n[run]\nwarmup = -1\n')
    r = CliRunner().invoke(main, ["bench", "--config", str(p), "--out", str(tmp_path / "o2")])
    assert r.exit_code == 2 and "warmup: -1" in r.output
    for line, name in (('compile_budget = "300"', "compile budget: '300'"), ("compile_budget = true", "compile budget"),
                       ("min_time = nan", "min time: nan")):
        p.write_text(f'[sweep]\nbackends = ["naive"]\n[run]\n{line}\n')
        r = CliRunner().invoke(main, ["bench", "--config", str(p), "--out", str(tmp_path / "o3")])
        assert r.exit_code == 2 and name in r.output and "finite number of seconds" in r.output, (line, r.output)
    p.write_text('[sweep]\nbackends = ["naive"]\n[run]\ncheck = "false"\n')    # a string was taken as true
    r = CliRunner().invoke(main, ["bench", "--config", str(p), "--out", str(tmp_path / "o4")])
    assert r.exit_code == 2 and "check: 'false' must be true or false" in r.output, r.output


def test_resume_keeps_every_record_a_run_left_and_refuses_a_line_it_cannot_read(tmp_path):
    """A rewrite for --resume keeps a run folder's step, memory and run records and each step's copy of a cell (a
    cell recorded twice in one step is dropped); a line that is not a JSON record, other than a torn last line, is
    an error naming the line (bench: exit 2), not a record dropped without a word. ``run --resume`` refuses a
    bench's folder (it would erase its records)."""
    from attnlab.sweep import engine

    out = tmp_path / "r"
    _run_folder(out, 1.0)
    path = out / "results.jsonl"
    before = path.read_text().splitlines()
    path.write_text("\n".join(before + [before[1], '{"torn']) + "\n")   # the timing step's cell again, a torn line
    kept = [(r.get("kind"), r.get("step")) for r in map(json.loads, before)]
    engine._compact(str(path), engine.Options())
    assert [(r.get("kind"), r.get("step")) for r in map(json.loads, path.read_text().splitlines())] == kept
    path.write_text("\n".join(before[:2] + ["[1, 2]"] + before[2:]) + "\n")
    bench = ["bench", "--backends", "naive", "--seq", "16", "--heads", "2", "--head-dim", "8", "--dtype", "float32",
             "--out", str(out)]
    r = CliRunner().invoke(main, bench + ["--resume"])
    assert r.exit_code == 2 and "line 3 is not a JSON record" in r.output, r.output
    _write(path, [_rec(1.0)])
    r = CliRunner().invoke(main, ["run", "--quick", "--out", str(out), "--resume"])
    assert r.exit_code == 2 and "no attnlab run wrote" in r.output and len(path.read_text().splitlines()) == 1
