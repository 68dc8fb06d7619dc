"""The compile watchdog: a compilation that runs past its budget is abandoned and the cell skipped."""
from __future__ import annotations

import threading

import jax

from .record import Skip


def _with_budget(fn, budget_s):
    """Run fn() in a daemon thread; (result, None) or raise; Skip('over_budget') past the budget.

    JAX's config contexts are thread-local: the caller's x64 setting (on for float64 cells) is
    carried into the thread, or the thread would trace float64 inputs as float32."""
    if not budget_s:
        return fn()
    box: dict = {}
    x64 = bool(jax.config.jax_enable_x64)

    def target():
        try:
            with jax.enable_x64(x64):
                box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True, name="attnlab-compile")
    t.start()
    t.join(budget_s)
    if t.is_alive():
        raise Skip("over_budget", f"compile ran past its {budget_s:g} s budget; abandoned and skipped")
    if "error" in box:
        raise box["error"]
    return box["value"]


with_budget = _with_budget


def compile_within_budget(timed, args, budget_s, ahead=None):
    """(compiled, lower_s, compile_s) of ``timed`` for ``args`` (``timers.compile_seconds``), or the
    result of ``ahead``, a future of that same call started earlier (``attnlab.measure.ahead``);
    Skip('over_budget') when it is not ready within ``budget_s`` seconds of asking."""
    from . import timers

    if ahead is not None:
        return _with_budget(ahead.result, budget_s)
    return _with_budget(lambda: timers.compile_seconds(timed, args), budget_s)
