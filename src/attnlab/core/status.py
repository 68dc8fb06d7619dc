"""A cell's outcome (``Status``) and the clocks a timed record may name (``TIMERS``)."""
from __future__ import annotations

import enum


class Status(enum.StrEnum):
    """A cell's outcome; ``ok`` and ``unchecked`` are timed (``timed``), every other status says why not."""

    OK = "ok"
    UNCHECKED = "unchecked"
    INCORRECT = "incorrect"
    UNSUPPORTED = "unsupported"
    OOM = "oom"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    OVER_BUDGET = "over_budget"

    @property
    def timed(self) -> bool:
        return self in (Status.OK, Status.UNCHECKED)


STATUSES = tuple(s.value for s in Status)
#: timer name -> the time field it fills
TIMERS = {"cupti": "kernel_ms", "cuda_events": "kernel_ms", "wall": "wall_ms"}
GRAD_MODES = ("fwd+bwd", "bwd")
