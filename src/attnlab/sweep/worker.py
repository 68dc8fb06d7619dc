"""Ctrl-C within a second, whatever a cell is doing: each cell runs in a daemon worker thread.

Python delivers SIGINT to the main thread only between bytecodes; a main thread inside one long
XLA call (a compile, a reference check) would not see it for minutes. So the main thread only
waits, in slices of ``POLL_S`` seconds, and a KeyboardInterrupt there abandons the worker: the
cell is lost, the finished cells are on disk, and the caller exits. The abandoned thread may still
be inside XLA's C++; the CLI then ends the process with ``os._exit`` after flushing its output
(``attnlab.cli._app.leave``), since an interpreter shutdown would abort in XLA (exit 134). The wait
is the job's own event (``attnlab.measure.threads.Background``), never ``Thread.join``.
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

from ..measure.threads import JaxThread

T = TypeVar("T")
POLL_S = 0.1


class Abandoned(KeyboardInterrupt):
    """Ctrl-C while a worker was still running; ``thread`` is the abandoned (daemon) thread."""

    def __init__(self, thread: threading.Thread):
        super().__init__("interrupted; the running cell was abandoned")
        self.thread = thread


def call_interruptibly(fn: Callable[[], T], name: str = "attnlab-cell") -> T:
    """``fn()`` in a daemon thread; its result or its exception. KeyboardInterrupt while waiting
    raises ``Abandoned``. JAX's x64 setting (per thread) is carried into the worker."""
    job = JaxThread(fn, name)
    try:
        while not job.wait(POLL_S):   # never Thread.join: Ctrl-C inside it can mark a running thread ended
            pass
    except KeyboardInterrupt:
        if job.running():
            raise Abandoned(job.thread) from None
        raise
    return job.result()
