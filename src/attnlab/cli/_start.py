"""Ctrl-C at any moment is exit 130. Two ways Python loses one: a KeyboardInterrupt raised inside JAX's
garbage-collection callback is printed as "Exception ignored" and dropped (the command's imports take about
a second, JAX's among them, and the command then ran on), and one raised inside a C extension's module
init becomes ``ImportError: initialization failed`` (matplotlib's, imported when ``run`` starts).
``watch()`` (before the CLI's imports) replaces Python's SIGINT handler: while the CLI is imported (nothing
is written yet) Ctrl-C ends the process at once with 130; from ``after_imports()`` on the handler notes
the signal and raises exactly as Python's does; the entry (``_app._Main``) calls ``reset()`` when a command starts and reads ``seen()`` when
it fails: a failure after Ctrl-C is 130. Nothing is installed where SIGINT is not Python's default (a
background job of a non-interactive shell ignores it) or off the main thread.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

_SEEN: list[int] = []
_STARTING: list[bool] = [True]


def _leave_130() -> None:
    """``os._exit``: a KeyboardInterrupt that once left a C extension's call makes Python end by SIGINT
    whatever ``sys.exit`` asked; at start nothing is written yet."""
    print("Aborted! (Ctrl-C while starting)", file=sys.stderr, flush=True)
    os._exit(130)


def _note(signum, frame):
    if _STARTING:
        _leave_130()
    _SEEN.append(signum)
    raise KeyboardInterrupt


def watch() -> None:
    """Take SIGINT (where it is Python's default) and SIGTERM (where it is the system's: ``kill``'s signal, which
    would end the process by the signal, results.csv unwritten) as Ctrl-C: exit 130, the resume command said."""
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _note)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _note)


def after_imports(interrupted: bool = False) -> None:
    """The CLI is imported: from now on Ctrl-C raises (and is noted). Exit 130 if ``interrupted`` (a
    KeyboardInterrupt came out of the imports: the handler was not ours)."""
    _STARTING.clear()
    if interrupted:
        _leave_130()


def _leave_now(signum, frame):
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:  # noqa: BLE001 - a closed pipe: nothing more can be said
            pass
    os._exit(130)


def tearing_down() -> None:
    """The command is over (its records on disk, its lines printed): Ctrl-C during the interpreter's teardown
    (JAX's atexit clean-up takes a moment) ends the process with 130 at once, never a traceback printed from an
    atexit callback over an exit code of 0, nor death by the signal."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) in (_note, signal.default_int_handler):
                signal.signal(signum, _leave_now)


def reset() -> None:
    _SEEN.clear()


def seen() -> bool:
    """Whether Ctrl-C came since the last ``reset()``."""
    return bool(_SEEN)
