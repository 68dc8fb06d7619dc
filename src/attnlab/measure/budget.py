"""The compile watchdog: a compilation that runs past its budget is abandoned and the cell skipped."""
from __future__ import annotations

from . import timers
from .outcome import Skip, Status
from .threads import JaxThread


def _with_budget(fn, budget_s):
    """fn() in a daemon thread (``threads.JaxThread``): its result, or its exception re-raised;
    Skip('over_budget') past the budget."""
    if not budget_s:
        return fn()
    job = JaxThread(fn, "attnlab-compile")
    if not job.wait(budget_s):
        raise Skip(Status.OVER_BUDGET, f"compile ran past its {budget_s:g} s budget (--compile-budget); abandoned and skipped")
    return job.result()


def compile_within_budget(timed, args, budget_s, ahead=None):
    """(compiled, lower_s, compile_s) of ``timed`` for ``args`` (``timers.compile_seconds``), or the
    result of ``ahead``, a future of that same call started earlier (``attnlab.measure.ahead``);
    Skip('over_budget') when it is not ready within ``budget_s`` seconds of asking."""
    if ahead is not None:
        return _with_budget(ahead.result, budget_s)
    return _with_budget(lambda: timers.compile_seconds(timed, args), budget_s)
