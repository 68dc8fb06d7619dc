"""Compile the check's reference programs of the coming cells in a background thread.

The first cell of each new shape used to pay for compiling its references (``attnlab.measure.check``:
the blockwise float32 reference with its kernel-like emulation, their gradients for fwd+bwd / bwd
cells, and the error reduction), about 1-2 s of XLA compile a shape on the H200 and 0.5 s on a laptop's
CPU. Those programs depend only on the cell's shapes and mask rules, so ``start(cells)`` queues them for one
daemon thread that compiles them one at a time (``attnlab.reference.check_programs.check_compiles``) while
earlier cells are measured; the check then finds them compiled, or waits for the compile already under way
(never a second compile). They are compiled without XLA's GPU autotuner, so on a GPU the compile runs no kernel
on the device and may run beside a timed cell (CUPTI counts only what runs on the device). On a CPU the compile
would share the cores with the timed kernels, so a timed CPU cell first ``hold``s the thread (waiting for the
compile under way, starting none) until it is ``release``d: the sweep engine does so around each cell's timing.

Cells skipped here (float64: x64 is set per thread; sharded: their placement is part of the program; a
backend that is not available: the cell is never checked) compile their references in their own check, as
before. A failed compile here is not reported here: a check already waiting for it gets its error, a later
check compiles again and reports it. A cell over its cell budget (``ahead.over_budget``) queues nothing: it
will not run. The thread ends when the queue is empty (a later ``start`` starts another) and is registered
with ``attnlab.measure.threads``, whose cancel drops the queued compiles not begun, so no compile is left
inside XLA when the process ends.
"""
from __future__ import annotations

import queue
import threading

import jax

from .. import backends
from ..reference import check_programs
from ..reference.compiled import precompile
from ..reference.output_errors import sample_rows
from . import threads
from .ahead import over_budget, shapes
from .check import semantics
from .inputs import call_extras

_QUEUE: queue.Queue = queue.Queue()
_QUEUED: set = set()
_THREAD: list[threading.Thread] = []
_LOCK = threading.Lock()
#: Held by the thread while it compiles, and by a timed CPU cell (``hold``) while it is timed.
_COMPILING = threading.Lock()


def check_shapes(cell) -> tuple:
    """(q, k, v, grads, keyword arguments) of ``check_programs.check_compiles`` for ``cell``'s check."""
    q, k, v = shapes(cell)[:3]
    n_batch = len(sample_rows(0, cell.batch, cell.q_len)[0])
    return q, k, v, cell.mode != "fwd", {**semantics(cell, call_extras(cell)).device_shapes(cell.q_len), "n_batch": n_batch}


def why_not(cell, opts=None) -> str | None:
    """Why ``cell``'s references are not compiled ahead (None: they are); with ``opts``, a cell over
    its cell budget is not."""
    if cell.dtype == "float64":
        return "float64: x64 is set per thread"
    if cell.strategy is not None:
        return "sharded: the placement of its inputs is part of its programs"
    try:
        why = backends.get(cell.backend).available()
    except ValueError as e:
        why = str(e)
    return f"never checked: {cell.backend}: {why}" if why else over_budget(cell, opts)


def _work() -> None:
    while True:
        with _LOCK:
            if _QUEUE.empty():
                _THREAD.clear()
                return
            q, k, v, grads, kw = _QUEUE.get()
        for program, args, options in check_programs.check_compiles(q, k, v, grads=grads, **kw):
            try:
                with _COMPILING:      # one program at a time: a timed CPU cell waits for one at most
                    precompile(program, *args, **options)
            except Exception:  # noqa: BLE001 - the cell's own check compiles again and reports it
                pass


def hold() -> bool:
    """On a CPU: wait for the compile under way and start none until ``release()`` (a cell is about to be timed
    on the cores the compile would share); returns whether it holds (nothing to hold on a GPU)."""
    if jax.default_backend() != "cpu":
        return False
    _COMPILING.acquire()
    return True


def release() -> None:
    """Let the thread compile again after ``hold()`` (from any thread)."""
    _COMPILING.release()


def cancel() -> int:
    """Drop the queued compiles not begun (a later ``start`` queues their cells again); returns how many."""
    n = 0
    with _LOCK:
        while not _QUEUE.empty():
            q, k, v, grads, kw = _QUEUE.get()
            _QUEUED.discard((q, k, v, grads, tuple(sorted(kw.items()))))
            n += 1
    return n


def start(cells, check: bool = True, opts=None) -> int:
    """Queue the reference programs of ``cells`` not queued before (``opts``: none of a cell over its cell
    budget); returns how many cells'."""
    if not check:
        return 0
    n = 0
    for cell in cells:
        try:
            if why_not(cell, opts):
                continue
            q, k, v, grads, kw = check_shapes(cell)
        except Exception:  # noqa: BLE001 - a cell that cannot even be described says so when measured
            continue
        key = (q, k, v, grads, tuple(sorted(kw.items())))
        with _LOCK:
            if key not in _QUEUED:
                _QUEUED.add(key)
                _QUEUE.put((q, k, v, grads, kw))
                n += 1
    with _LOCK:
        if not _QUEUE.empty() and not _THREAD:
            _THREAD.append(threads.start(_work, "attnlab-references", cancel=cancel))
    return n
