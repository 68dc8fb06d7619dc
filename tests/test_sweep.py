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
    r = CliRunner().invoke(main, ISSUE_ARGS + ["--out", str(out), "--repeats", "2"])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 32 and all(x["status"] == "ok" for x in recs)
    assert len({json.dumps([x[k] for k in ("backend", "batch", "q_len", "dtype", "causal")]) for x in recs}) == 32
    for x in recs:
        assert x["env"]["jax"] and x["env"]["platform"] == "cpu" and "xla_flags" in x["env"]
    csv = (out / "results.csv").read_text().splitlines()
    assert len(csv) == 33 and csv[0].startswith("backend,batch,q_len")
    assert "naive" in r.output and "ms · TFLOP/s" in r.output


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
    ({"backends": "xla", "heads": "3", "kv_heads": "2"}, "no valid cell"),
    ({"backends": "xla", "colour": "red"}, "unknown sweep key"),
    ({"seq": "8"}, "backends"),
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


def _bench_cmd(out):
    return [sys.executable, "-m", "attnlab.cli", "bench", "--backends", "naive,xla", "--batch", "1,2,3",
            "--seq", "16,32,48,64", "--heads", "2", "--head-dim", "8", "--dtype", "float32", "--causal", "both",
            "--repeats", "2", "--out", str(out)]   # 2 x 3 x 4 x 2 = 48 cells


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
    assert 6 <= len(partial) < 48, "the sweep should have been killed mid-way"
    with open(path, "a") as f:
        f.write('{"backend": "naive", "batch": 1, "q_len"')   # a line torn by the kill
    r = subprocess.run(_bench_cmd(out) + ["--resume"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    keys = [json.dumps([x[k] for k in ("backend", "batch", "q_len", "causal")]) for x in recs]
    assert len(recs) == 48 and len(set(keys)) == 48
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
