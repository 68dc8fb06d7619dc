"""The background threads that run JAX calls, and how a process leaves while one still runs.

A daemon thread that is inside XLA's C++ when the interpreter shuts down is killed by CPython as
it takes the GIL back (``pthread_exit``: a forced unwind through XLA's C++ frames, which ends in
"terminate called after throwing an instance of ''" / "FATAL: exception not rethrown", exit 134, or
a segmentation fault). So every such thread (``JaxThread``: the cell worker and the compile
watchdog; ``attnlab.measure.ahead``'s compiles; ``attnlab.measure.prefetch``'s references) is
registered here with a way to cancel what it has not started, and nothing may tear the
interpreter down while one runs: ``settle(timeout_s)`` cancels, joins, and says which are left,
and a command line that still has one leaves with ``os._exit`` after flushing (``attnlab.cli``).
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import jax

_LOCK = threading.Lock()
#: Live background threads and their cancel hooks (None: nothing to cancel, only to wait for).
_LIVE: dict[threading.Thread, Callable[[], None] | None] = {}


def start(target: Callable[[], None], name: str, cancel: Callable[[], None] | None = None) -> threading.Thread:
    """Run ``target()`` in a registered daemon thread; ``cancel()`` (optional) asks it to skip the
    work it has not begun (a compile under way cannot be stopped, only waited for)."""
    def run():
        try:
            target()
        finally:
            with _LOCK:
                _LIVE.pop(threading.current_thread(), None)

    t = threading.Thread(target=run, daemon=True, name=name)
    with _LOCK:
        _LIVE[t] = cancel
    t.start()
    return t


def running() -> list[threading.Thread]:
    """The registered background threads still alive."""
    with _LOCK:
        return [t for t in _LIVE if t.is_alive()]


def cancel_all() -> None:
    """Tell every registered thread to skip what it has not begun."""
    with _LOCK:
        hooks = [c for c in _LIVE.values() if c is not None]
    for cancel in hooks:
        cancel()


def settle(timeout_s: float) -> list[threading.Thread]:
    """Cancel what has not begun, then wait up to ``timeout_s`` seconds for the registered threads to
    end; returns those still running (empty: the interpreter may shut down safely)."""
    cancel_all()
    deadline = time.monotonic() + max(0.0, timeout_s)
    for t in running():
        t.join(max(0.0, deadline - time.monotonic()))
    return running()


class JaxThread:
    """``fn()`` started at once in a registered daemon thread; ``result()`` re-raises its exception
    in the caller.

    JAX's config contexts are thread-local: the caller's x64 setting (on for float64 cells) is
    carried into the thread, or the thread would trace float64 inputs as float32."""

    def __init__(self, fn: Callable, name: str):
        self._box: dict = {}
        x64 = bool(jax.config.jax_enable_x64)

        def target():
            try:
                with jax.enable_x64(x64):
                    self._box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                self._box["error"] = e

        self.thread = start(target, name)

    def result(self):
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]
