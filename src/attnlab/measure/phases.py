"""Where a cell's wall time goes: ``inputs_s``, ``check_s``, ``timing_s`` (``compile_s`` is the compiler's own).

``Phases(rec, on_phase)`` is used as ``with phases("check"): ...``: the seconds spent inside are
added to ``rec["check_s"]`` and ``on_phase("check")`` is told when the phase starts (a progress
display shows it). The compile phase is announced but its seconds are ``compile_s`` =
lower + compile, measured around the compiler alone (``timers.compile_seconds``).
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable

#: The phases a cell walks through, in order (``on_phase`` receives these names).
PHASES = ("inputs", "compile", "check", "timing")


class Phases:
    def __init__(self, rec: dict, on_phase: Callable[[str], None] | None = None):
        self.rec, self.on_phase = rec, on_phase
        for name in PHASES:
            if name != "compile":
                rec[f"{name}_s"] = None

    @contextlib.contextmanager
    def __call__(self, name: str, record: bool = True):
        if name not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {name!r}")
        if self.on_phase is not None:
            self.on_phase(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if record:
                key = f"{name}_s"
                self.rec[key] = (self.rec.get(key) or 0.0) + time.perf_counter() - t0
