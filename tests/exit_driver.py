"""``python tests/exit_driver.py COMMAND ARGS...``: the ``attnlab`` command line, with markers for the
moments a test sends Ctrl-C at (``tests/test_exit_codes.py``, ``tests/gpu/test_exit_codes_gpu.py``).

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
import sys
import time

PAUSE_S = 0.5

signal.signal(signal.SIGINT, signal.default_int_handler)


def mark(text: str) -> None:
    os.write(1, f"@{text}\n".encode())


def main() -> None:
    from attnlab.measure import env
    from attnlab.sweep import engine

    collect, measure, store = env.collect, engine._measure, engine.ResultStore

    def collect_marked(*a, **kw):
        mark("start")
        time.sleep(PAUSE_S)
        return collect(*a, **kw)

    def measure_marked(cell, todo, pending, opts, on_phase):
        def phase(c, name):
            mark(f"phase {name}")
            if on_phase:
                on_phase(c, name)

        return measure(cell, todo, pending, opts, phase)

    class MarkedStore(store):
        def append(self, rec):
            super().append(rec)
            mark("cell")
            time.sleep(PAUSE_S)

    env.collect, engine._measure, engine.ResultStore = collect_marked, measure_marked, MarkedStore
    from attnlab.cli import main as cli

    cli(sys.argv[1:], prog_name="attnlab")


if __name__ == "__main__":
    main()
