"""No exit code but 0, 1, 2 or 130, and never an abort in XLA's C++, however a sweep ends.

A thread inside XLA when the interpreter shuts down aborts the process ("terminate called after
throwing an instance of ''", exit 134; ``attnlab.measure.threads``): compiles ahead of cells over
their budget, compiles ahead left running when the sweep ends, and Ctrl-C at each moment of a sweep.
"""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

DRIVER = os.path.join(os.path.dirname(__file__), "exit_driver.py")
CODES = {0, 1, 2, 130}
CRASH_WORDS = ("terminate called", "FATAL", "Segmentation fault", "Traceback")
TINY = ["--heads", "2", "--head-dim", "8", "--dtype", "float32", "--repeats", "2"]
#: Ctrl-C at each moment of a sweep: (marker of exit_driver.py, times)
MOMENTS = {"before the first cell": "@start", "mid-compile": "@phase compile", "mid-check": "@phase check",
           "between cells": "@cell"}


def _env():
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
            "JAX_PLATFORMS": "cpu"}


def run_cli(args, interrupt_at=None, timeout=120):
    """(exit code, output, seconds from the signal to the exit) of ``attnlab ARGS`` run by exit_driver.py;
    ``interrupt_at``: SIGINT as that marker line appears (None: no signal)."""
    proc = subprocess.Popen([sys.executable, DRIVER, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=_env(), start_new_session=True)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    lines, sent = [], None
    try:
        for line in proc.stdout:
            lines.append(line)
            if interrupt_at and sent is None and line.startswith(interrupt_at):
                proc.send_signal(signal.SIGINT)
                sent = time.monotonic()
        code = proc.wait()
    finally:
        killer.cancel()
    return code, "".join(lines), (time.monotonic() - sent) if sent else None


def assert_clean_exit(code, out):
    assert code in CODES, f"exit {code}:\n{out}"
    for word in CRASH_WORDS:
        assert word not in out, f"{word!r} in the output (exit {code}):\n{out}"


#: Every run of the file, started at once (each process is mostly JAX's import; run side by side they
#: take the wall time of a few): name -> (command line, marker to send SIGINT at or None).
RUNS = {
    **{f"over budget {i}": (["bench", "--backends", "xla,naive", "--seq", "16,32,48", *TINY, "--cell-budget", "0.001"],
                            None) for i in range(2)},
    **{f"advise {i}": (["advise", "--model", "llama-3.1-8b", "--context", "16", "--phase", "prefill,decode,train",
                        "--backends", "xla", "--repeats", "2", "--cell-budget", "0.001"], None) for i in range(2)},
    **{f"{moment} {i}": (["bench", "--backends", "xla", "--seq", "16,32", *TINY, "--min-time", "0"], marker)
       for moment, marker in MOMENTS.items() for i in range(2)},
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """name -> (exit code, output, seconds from SIGINT to the exit) of every run in RUNS."""
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path_factory.mktemp("exits")
    with ThreadPoolExecutor(4) as pool:
        futs = {name: pool.submit(run_cli, [*args, "--out", str(root / f"o{n}")], marker)
                for n, (name, (args, marker)) in enumerate(RUNS.items())}
        return {name: f.result() for name, f in futs.items()}


@pytest.mark.parametrize("i", range(2))
def test_a_bench_of_cells_over_budget_exits_0(outcomes, i):
    """Every cell over its budget: none is compiled, ahead or not (before: compiled ahead, exit 134)."""
    code, out, _ = outcomes[f"over budget {i}"]
    assert_clean_exit(code, out)
    assert code == 0 and out.count("over_budget") >= 6 and "@phase" not in out, out


@pytest.mark.parametrize("i", range(2))
def test_advise_of_a_small_context_over_budget_exits_0(outcomes, i):
    code, out, _ = outcomes[f"advise {i}"]
    assert_clean_exit(code, out)
    assert code == 0 and "over_budget" in out and "@phase" not in out, out


@pytest.mark.parametrize("i", range(2))
@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_at_any_moment_exits_130_within_a_second(outcomes, moment, i):
    code, out, after = outcomes[f"{moment} {i}"]
    assert_clean_exit(code, out)
    assert after is not None, f"no {MOMENTS[moment]!r} line:\n{out}"
    assert after < 5, f"{after:.1f} s from Ctrl-C to the exit (about 1 s on an idle CPU)"
    assert code == 130, out
    assert ("--resume" in out) == (moment != "before the first cell"), out
