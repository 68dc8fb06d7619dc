"""``python tests/exit_driver.py COMMAND ARGS...``: the ``attnlab`` command line, with markers for the
moments a test sends Ctrl-C at; ``run_cli`` runs it and sends the signal (``tests/test_exit_codes.py``,
``tests/gpu/test_exit_codes_gpu.py``).

Each marker is a line on stdout, written before the moment it names:

- ``@start``: the sweep is starting (``attnlab.measure.env.collect``, before the first cell); the
  main thread then waits ``PAUSE_S`` there, as it would on a slow driver query;
- ``@phase NAME``: the running cell enters a phase (inputs, compile, check, timing);
- ``@cell``: a cell's record is written; the main thread then waits ``PAUSE_S`` there, between
  cells, where a compile ahead of the next cell runs and no cell's worker does.

SIGINT gets Python's own handler whatever the parent left (a background job of a shell ignores it).
"""
import os
import signal
import subprocess
import sys
import threading
import time

PAUSE_S = 0.5
#: The exit codes of the command line: ok, failure, bad input, Ctrl-C.
CODES = {0, 1, 2, 130}
#: Words of a process that died in C++ (or of a Python error that got through).
CRASH_WORDS = ("terminate called", "FATAL", "Segmentation fault", "Fatal Python error", "Traceback")


def mark(text: str) -> None:
    os.write(1, f"@{text}\n".encode())


def main() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from attnlab.measure import env
    from attnlab.sweep import engine

    collect, measure, store = env.collect, engine._measure, engine.ResultStore

    def collect_marked(*a, **kw):
        mark("start")
        time.sleep(PAUSE_S)
        return collect(*a, **kw)

    def measure_marked(cell, todo, pending, opts, on_phase, *rest):
        def phase(c, name):
            mark(f"phase {name}")
            if on_phase:
                on_phase(c, name)

        return measure(cell, todo, pending, opts, phase, *rest)

    class MarkedStore(store):
        def append(self, rec):
            super().append(rec)
            mark("cell")
            time.sleep(PAUSE_S)

    env.collect, engine._measure, engine.ResultStore = collect_marked, measure_marked, MarkedStore
    from attnlab.cli import main as cli

    cli(sys.argv[1:], prog_name="attnlab")


def run_cli(args, interrupt_at=None, timeout=120, cpu=True, signum=signal.SIGINT):
    """(exit code, output, seconds from the signal to the exit) of ``attnlab ARGS`` run by this driver;
    ``interrupt_at``: ``signum`` (SIGINT) as a line starting with that marker appears, or that many seconds after
    the start (None: no signal). ``cpu``: JAX_PLATFORMS=cpu."""
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    if cpu:
        env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    sent: list[float] = []

    def interrupt():
        if not sent and proc.poll() is None:
            proc.send_signal(signum)
            sent.append(time.monotonic())

    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    timer = threading.Timer(interrupt_at, interrupt) if isinstance(interrupt_at, (int, float)) else None
    if timer:
        timer.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if isinstance(interrupt_at, str) and line.startswith(interrupt_at):
                interrupt()
        code = proc.wait()
    finally:
        killer.cancel()
        if timer:
            timer.cancel()
    return code, "".join(lines), (time.monotonic() - sent[0]) if sent else None


def assert_clean_exit(code, out):
    assert code in CODES, f"exit {code}:\n{out}"
    for word in CRASH_WORDS:
        assert word not in out, f"{word!r} in the output (exit {code}):\n{out}"


if __name__ == "__main__":
    main()
