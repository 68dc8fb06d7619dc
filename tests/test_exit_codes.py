"""No exit code but 0, 1, 2 or 130, and never an abort in XLA's C++, however a sweep ends.

A thread inside XLA when the interpreter shuts down aborts the process ("terminate called after
throwing an instance of ''", exit 134; ``attnlab.measure.threads``): compiles ahead of cells over
their budget, compiles ahead left running when the sweep ends, and Ctrl-C at each moment of a sweep
(``exit_driver.py`` marks the moments). Every run starts at once (each process is mostly JAX's
import): the file takes the wall time of a few.
"""
import os
import signal
import threading

import pytest
from exit_driver import assert_clean_exit, run_cli

from attnlab.measure import Cell, Options, ahead, prefetch, threads
from attnlab.sweep.worker import Abandoned, call_interruptibly

TINY = ["--heads", "2", "--head-dim", "8", "--dtype", "float32", "--repeats", "2"]
#: Ctrl-C at each moment of a sweep: the marker of exit_driver.py it is sent at.
MOMENTS = {"before the first cell": "@start", "mid-compile": "@phase compile", "mid-check": "@phase check",
           "between cells": "@cell"}
#: name -> (command line, marker to send SIGINT at or None).
RUNS = {
    "over budget": (["bench", "--backends", "xla,naive", "--seq", "16,32,48", *TINY, "--cell-budget", "0.001"], None),
    "advise": (["advise", "--model", "llama-3.1-8b", "--context", "16", "--phase", "prefill,decode,train", "--backends",
                "xla", "--repeats", "2", "--cell-budget", "0.001"], None),
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


def test_a_cell_over_its_budget_is_never_compiled_ahead():
    cell = Cell("xla", 1, 16, 16, 2, 2, 8, "float32")
    assert ahead.start(cell, Options(cell_budget_s=0.001)) is None
    assert "cell budget" in ahead.why_not(cell, Options(cell_budget_s=0.001))
    assert "cell budget" in prefetch.why_not(cell, Options(cell_budget_s=0.001))
    assert ahead.why_not(cell, Options(cell_budget_s=1e6)) is None and prefetch.why_not(cell, Options()) is None


def test_a_bench_of_cells_over_budget_exits_0(outcomes):
    """Every cell over its budget: none is compiled, ahead or not (before: compiled ahead, exit 134)."""
    code, out, _ = outcomes["over budget"]
    assert_clean_exit(code, out)
    assert code == 0 and out.count("over_budget") >= 6 and "@phase" not in out, out


def test_advise_of_a_small_context_over_budget_exits_0(outcomes):
    code, out, _ = outcomes["advise"]
    assert_clean_exit(code, out)
    assert code == 0 and "over_budget" in out and "@phase" not in out, out


def test_ctrl_c_while_a_cell_runs_abandons_it_and_knows_it_still_runs():
    """On Python 3.11/3.12 Ctrl-C inside ``Thread.join`` marks the running thread ended; the cell's own
    event does not lie, so the CLI knows a thread is still inside XLA."""
    release = threading.Event()
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            call_interruptibly(lambda: release.wait(20))
        except Abandoned:
            pass
        except KeyboardInterrupt:   # Abandoned is one: this is the plain one, for a cell taken as ended
            pytest.fail("Ctrl-C took the running cell for ended")
        else:
            pytest.fail("no Ctrl-C arrived")
        assert threads.running(), "the cell still runs"
    finally:
        signal.signal(signal.SIGINT, old)
        release.set()
    assert not threads.settle(5)


@pytest.mark.parametrize("i", range(2))
@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_at_any_moment_exits_130_within_a_second(outcomes, moment, i):
    code, out, after = outcomes[f"{moment} {i}"]
    assert_clean_exit(code, out)
    assert after is not None, f"no {MOMENTS[moment]!r} line:\n{out}"
    assert after < 5, f"{after:.1f} s from Ctrl-C to the exit (about 1 s on an idle CPU)"
    assert code == 130, out
    assert ("--resume" in out) == (moment != "before the first cell"), out


@pytest.mark.parametrize("delay", [0.3, 0.8])
def test_ctrl_c_while_the_command_line_starts_exits_130_at_once(tmp_path, delay):
    """SIGINT while ``attnlab`` imports itself and JAX (about the first second): 130 at once, no traceback.
    Python alone dropped it there (raised inside JAX's gc callback: the run went on and exited 0) or died
    by the signal with a traceback (``attnlab.cli._start``)."""
    import subprocess
    import sys
    import time

    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": src}
    # Python's own SIGINT handler whatever the parent left (a background job of a shell ignores SIGINT)
    start = ("import signal, runpy, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "sys.argv = ['attnlab', *sys.argv[1:]]; runpy.run_module('attnlab.cli', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", start, "run", "--quick", "--out", str(tmp_path / "o")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    time.sleep(delay)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    after = time.monotonic() - sent
    assert proc.returncode == 130 and "Traceback" not in out, (proc.returncode, out[-3000:])
    assert after < 2, f"{after:.2f} s from Ctrl-C to the exit"


def test_a_command_that_fails_after_ctrl_c_exits_130():
    """Ctrl-C inside a C extension's import comes out as ``ImportError: initialization failed`` (matplotlib's,
    when ``run`` starts): after a SIGINT, a failure is 130, not 1."""
    import subprocess
    import sys

    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    script = """if True:
        import os, signal, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from attnlab.cli import main

        @main.command()
        def boom():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt:
                raise ImportError("initialization failed")

        main(["boom"], prog_name="attnlab")
    """
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": src}, start_new_session=True)
    assert r.returncode == 130, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])


def test_ctrl_c_while_the_interpreter_tears_down_exits_130_without_a_traceback():
    """The command is over and leaves with sys.exit(0); a Ctrl-C inside an atexit callback (JAX's clean-up) once
    printed a traceback and still exited 0, or killed the process by the signal. ``tearing_down`` makes it 130."""
    import subprocess
    import sys

    code = ("import os, signal, sys, time, atexit\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"   # a background job's parent ignores it
            "from attnlab.cli import _start\n"
            "_start.watch(); _start.after_imports()\n"
            "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(2)))\n"
            "_start.tearing_down()\n"
            "sys.exit(0)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 130 and "Traceback" not in r.stderr, (r.returncode, r.stderr)


def test_sigterm_between_cells_is_taken_as_ctrl_c(tmp_path):
    """``kill`` (SIGTERM) ended a sweep by the signal (exit -15, results.csv unwritten, no resume command): it is
    Ctrl-C now, exit 130 with the resume command."""
    out = tmp_path / "o"
    code, text, _ = run_cli(["bench", "--backends", "xla", "--seq", "16,32", *TINY, "--min-time", "0", "--out",
                             str(out)], "@cell", signum=signal.SIGTERM)
    assert_clean_exit(code, text)
    assert code == 130 and "--resume" in text and (out / "results.csv").exists(), text
