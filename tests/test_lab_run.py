"""``attnlab run`` as a command (issues 22 and 23): its run record, a folder with results refused like
``bench`` does, Ctrl-C that says what finished and how to go on, and a quiet terminal whose logs go to
``OUT/run.log`` (a memory probe that cannot fit is predicted, never allocated)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from click.testing import CliRunner

from attnlab.cli import main
from attnlab.lab import STEPS

SRC = os.path.join(os.path.dirname(__file__), "..", "src")


def _records(out):
    return [json.loads(line) for line in open(os.path.join(out, "results.jsonl"), encoding="utf-8")]


def _env(**extra):
    return {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]), **extra}


def test_run_appends_a_run_record_and_ends_with_the_cost_line(tmp_path):
    out = str(tmp_path / "o")
    r = CliRunner().invoke(main, ["run", "--out", out, "--quick", "--sections", "qkv,timing"])
    assert r.exit_code == 0, r.output
    recs = _records(out)
    run = recs[-1]
    assert run["kind"] == "run" and run["status"] == "ok" and run["resumed"] is False
    assert [s["step"] for s in run["steps"]] == ["qkv", "timing"] and run["steps_ok"] == 2
    assert run["cells"] == sum(r["kind"] == "cell" for r in recs) and run["cells_resumed"] == 0
    assert set(run["backends"]) >= {"naive", "xla"} and run["env"]["platform"]
    for f in ("wall_s", "compile_s", "check_s", "timing_s", "cell_s"):
        assert isinstance(run[f], (int, float)), f
    lines = r.output.strip().splitlines()
    assert any(line.startswith(f"{run['cells']} cells in ") and "compile" in line for line in lines[-2:])
    titles = [STEPS[sid].title for sid in ("qkv", "timing")]   # numbered by the registry ("2. Queries, ...")
    assert sum(any(t in line for t in titles) for line in lines) == 2   # one line per step
    # a resumed run says so, and counts the cells it took from the stopped run
    r = CliRunner().invoke(main, ["run", "--out", out, "--quick", "--sections", "qkv,timing", "--resume"])
    assert r.exit_code == 0, r.output
    runs = [x for x in _records(out) if x["kind"] == "run"]
    assert [x["resumed"] for x in runs] == [False, True]
    assert runs[-1]["cells"] == 0 and runs[-1]["cells_resumed"] == runs[0]["cells"]
    # measured nothing: no "N cells in X s" for the stopped run's cells
    assert f"0 cells measured, {runs[0]['cells']} resumed from {out}/sweeps" in " ".join(r.output.split()), r.output


def test_a_cold_resume_is_no_resume_and_no_step_id_is_refused(tmp_path):
    out = str(tmp_path / "fresh")
    r = CliRunner().invoke(main, ["run", "--out", out, "--quick", "--sections", "qkv", "--resume"])
    assert r.exit_code == 0, r.output
    assert [x["resumed"] for x in _records(out) if x["kind"] == "run"] == [False]     # nothing was there to go on with
    for empty in ("", ",,"):
        r = CliRunner().invoke(main, ["run", "--out", str(tmp_path / "e"), "--quick", "--sections", empty])
        assert r.exit_code == 2 and "names no step id" in r.output, r.output


def test_the_run_record_counts_a_reused_program_s_compile_once():
    import types

    from attnlab.lab.run_record import run_record
    from attnlab.lab.step_types import LabConfig

    cell = dict(kind="cell", backend="xla", compile_s=1.5, cell_s=2.0)
    ctx = types.SimpleNamespace(measured={"a": cell, "b": dict(cell, program_reused=True)}, records=[cell], resume=False,
                                resumed={}, cfg=LabConfig(quick=True), label=None, env={})
    rec = run_record(ctx, [], [], 1.0)
    assert rec["compile_s"] == 1.5 and rec["cell_s"] == 4.0 and rec["cells"] == 2


def test_run_refuses_a_folder_with_results_like_bench(tmp_path):
    out = str(tmp_path / "o")
    assert CliRunner().invoke(main, ["run", "--out", out, "--quick", "--sections", "qkv"]).exit_code == 0
    before = open(os.path.join(out, "results.jsonl")).read()
    r = CliRunner().invoke(main, ["run", "--out", out, "--quick", "--sections", "qkv"])
    assert r.exit_code == 2 and "--resume" in r.output and "--overwrite" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert open(os.path.join(out, "results.jsonl")).read() == before     # nothing touched
    r = CliRunner().invoke(main, ["run", "--out", out, "--quick", "--sections", "qkv", "--overwrite"])
    assert r.exit_code == 0, r.output
    assert [x["resumed"] for x in _records(out) if x["kind"] == "run"] == [False]   # erased, not resumed
    r = CliRunner().invoke(main, ["run", "--out", out, "--quick", "--resume", "--overwrite"])
    assert r.exit_code == 2 and "contradict" in r.output


@pytest.mark.filterwarnings("ignore:os.fork")
def test_ctrl_c_says_what_finished_and_how_to_resume(tmp_path):
    out = str(tmp_path / "o")
    cmd = [sys.executable, "-m", "attnlab.cli", "run", "--out", out, "--quick", "--sections", "qkv,sweeps,decode"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    sweeps = os.path.join(out, "sweeps", "results.jsonl")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and p.poll() is None:
        if os.path.exists(sweeps) and open(sweeps).read().count("\n") >= 1:
            break
        time.sleep(0.1)
    assert p.poll() is None, p.communicate()
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, (stdout, stderr)
    assert "Aborted!" not in stdout + stderr and "Traceback" not in stdout + stderr
    assert "finished: qkv" in stdout
    assert f"attnlab run --out {out} --resume --quick --sections qkv,sweeps,decode" in stdout
    run = _records(out)[-1]
    assert run["kind"] == "run" and run["status"] == "interrupted" and run["stopped_in"] in ("sweeps", "decode")


def test_ctrl_c_after_the_last_step_leaves_an_interrupted_run_record(tmp_path, monkeypatch):
    """Ctrl-C while the report is written (every step done): LabInterrupted stopped in "report", and the last
    record is the run's, interrupted (``--resume`` then writes the report)."""
    from attnlab.lab import run as lab_run
    from attnlab.lab.run_record import LabInterrupted

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lab_run, "write_report", stop)
    out = str(tmp_path / "o")
    with pytest.raises(LabInterrupted) as e:
        lab_run.run_lab(out, quick=True, sections=["qkv"])
    assert e.value.stopped_in == "report" and e.value.finished == ["qkv"]
    run = _records(out)[-1]
    assert run["kind"] == "run" and run["status"] == "interrupted" and run["stopped_in"] == "report"


def test_the_terminal_stays_quiet_and_an_oversized_memory_probe_is_predicted(tmp_path):
    """The memory probe of step 11 against a device of 100 kB: every large program is recorded oom from its
    lowered program or compiled estimate (nothing allocated) and nothing but the run's lines reaches the terminal:
    XLA's C++ log lines (INFO asked for here) go to run.log."""
    out = str(tmp_path / "o")
    r = subprocess.run([sys.executable, "-m", "attnlab.cli", "run", "--out", out, "--quick", "--sections", "next"],
                       capture_output=True, text=True, timeout=240, env=_env(ATTNLAB_DEVICE_MEMORY_BYTES="100000", TF_CPP_MIN_LOG_LEVEL="0"))
    assert r.returncode == 0, r.stdout + r.stderr
    for bad in ("Traceback", "RESOURCE_EXHAUSTED", "WARNING", "E0000", "W0000"):
        assert bad not in r.stdout and bad not in r.stderr, bad
    assert r.stderr == ""
    log = open(os.path.join(out, "run.log")).read()
    assert "PjRt" in log   # XLA's C++ log (INFO, asked for) went to the file
    # and the run's own lines: what ran, each step as it starts and ends, the cost line, the summary
    for line in ("attnlab: log of: attnlab run --out", "attnlab: step next (1 of 1) starts", "attnlab: step next: ok",
                 " cells in ", "1 of 1 steps ok in "):
        assert line in log, line
    mem = [x for x in _records(out) if x["kind"] == "memory"]
    oom = [x for x in mem if x["status"] == "oom"]
    assert oom and all(x["reason"].startswith("predicted") and x["estimate_bytes"] > 100_000 for x in oom)
    assert any("not compiled" in x["reason"] for x in oom)


def test_logs_to_sends_fd2_and_python_warnings_to_the_file(tmp_path):
    code = ("import os, sys, warnings, logging\n"
            "from attnlab.lab.quiet import logs_to\n"
            "with logs_to(sys.argv[1]):\n"
            "    os.write(2, b'from C: RESOURCE_EXHAUSTED\\n')\n"
            "    warnings.warn('a python warning')\n"
            "    logging.getLogger('tokamax').warning('Autotuning cache miss')\n"
            "print('done')\n")
    log = str(tmp_path / "run.log")
    r = subprocess.run([sys.executable, "-c", code, log], capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode == 0 and r.stdout == "done\n" and r.stderr == "", (r.stdout, r.stderr)
    text = open(log).read()
    assert "RESOURCE_EXHAUSTED" in text and "a python warning" in text and "Autotuning cache miss" in text
