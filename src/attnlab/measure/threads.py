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
#: The background jobs not yet ended.
_LIVE: set = set()


class Background:
    """``target()`` in a registered daemon thread; ``cancel()`` (optional) asks it to skip the work
    it has not begun (a compile under way cannot be stopped, only waited for).

    Whether it has ended is its own event, never ``Thread.is_alive``: on Python 3.11 and 3.12 a
    KeyboardInterrupt that lands inside ``Thread.join(timeout)`` can mark a running thread stopped
    (``_wait_for_tstate_lock`` releases the lock the running thread holds), so after Ctrl-C a thread
    still inside XLA would pass for ended."""

    def __init__(self, target: Callable[[], None], name: str, cancel: Callable[[], None] | None = None):
        self.cancel, self.done = cancel, threading.Event()

        def run():
            try:
                target()
            finally:
                self.done.set()
                with _LOCK:
                    _LIVE.discard(self)

        self.thread = threading.Thread(target=run, daemon=True, name=name)
        with _LOCK:
            _LIVE.add(self)
        try:
            self.thread.start()
        except BaseException:
            with _LOCK:
                _LIVE.discard(self)
            raise

    def running(self) -> bool:
        return not self.done.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait up to ``timeout_s`` seconds for the end; True when it has ended."""
        return self.done.wait(timeout_s)


def start(target: Callable[[], None], name: str, cancel: Callable[[], None] | None = None) -> Background:
    """``Background(target, name, cancel)``: started and registered."""
    return Background(target, name, cancel)


def running() -> list[Background]:
    """The registered background jobs not yet ended."""
    with _LOCK:
        return [b for b in _LIVE if b.running()]


def cancel_all() -> None:
    """Tell every registered job to skip what it has not begun."""
    for b in running():
        if b.cancel is not None:
            b.cancel()


#: The names of the jobs that compile (the watchdog's, ``attnlab.measure.budget``; the ahead ones, ``ahead``).
COMPILE_NAMES = ("attnlab-compile", "attnlab-ahead")


def wait_compiles() -> float:
    """Wait for every registered compile to end, one abandoned past its budget too (a compile cannot be stopped,
    and a timer beside one would count it); returns the seconds waited."""
    t0 = time.monotonic()
    for b in running():
        if b.thread.name.startswith(COMPILE_NAMES):
            b.wait()
    return time.monotonic() - t0


def settle(timeout_s: float) -> list[Background]:
    """Cancel what has not begun, then wait up to ``timeout_s`` seconds for the registered jobs to
    end; returns those still running (empty: the interpreter may shut down safely)."""
    cancel_all()
    deadline = time.monotonic() + max(0.0, timeout_s)
    for b in running():
        b.wait(max(0.0, deadline - time.monotonic()))
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

        self._job = start(target, name)
        self.thread = self._job.thread

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait up to ``timeout_s`` seconds for ``fn`` to end (safe under Ctrl-C); True when it has."""
        return self._job.wait(timeout_s)

    def running(self) -> bool:
        return self._job.running()

    def result(self):
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]
