"""Where a cell's wall time goes: ``inputs_s``, ``check_s``, ``timing_s`` (``compile_s`` is the compiler's own).

``Phases(on_phase)`` is used as ``with phases("check"): ...``: the seconds spent inside are added to
``phases.seconds["check_s"]`` (the cell's record takes them) and ``on_phase("check")`` is told when
the phase starts (a progress display shows it). The compile phase's seconds are ``compile_s`` = lower + compile, measured
around the compiler alone (``timers.compile_seconds``); the cell's wall seconds in that phase are
``compile_wait_s`` (less than ``compile_s`` when the cell was compiled ahead: ``measure.ahead``).
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable

#: The phases a cell walks through, in order (``on_phase`` receives these names).
PHASES = ("inputs", "compile", "check", "timing")


class Phases:
    def __init__(self, on_phase: Callable[[str], None] | None = None):
        self.on_phase = on_phase
        self.seconds: dict[str, float | None] = {f"{name}_s" if name != "compile" else "compile_wait_s": None
                                                 for name in PHASES}

    @contextlib.contextmanager
    def __call__(self, name: str, key: str | None = None):
        if name not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {name!r}")
        if self.on_phase is not None:
            self.on_phase(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            key = key or f"{name}_s"
            self.seconds[key] = (self.seconds.get(key) or 0.0) + time.perf_counter() - t0
