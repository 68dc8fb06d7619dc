"""Compile the check's reference programs of the coming cells in a background thread, on a GPU.

The first cell of each new shape used to pay for compiling its references (``attnlab.measure.check``:
the blockwise float32 reference with its kernel-like emulation, their gradients for fwd+bwd / bwd
cells, and the error reduction), about 1-2 s of XLA compile a shape on the H200. Those programs
depend only on the cell's shapes and mask rules, so ``start(cells)`` queues them for one daemon
thread that compiles them (``attnlab.reference.check_programs.precompile_check``) while earlier cells are
measured; the check then finds them compiled, or waits for the compile already under way (never a
second compile). They are compiled without XLA's GPU autotuner, so the compile runs no kernel on the
device and may run beside a timed cell (CUPTI counts only what runs on the device).

Nothing is queued on a CPU: there the compile would share the cores with the timed kernels. Cells
skipped here (float64: x64 is set per thread; sharded: their placement is part of the program)
compile their references in their own check, as before. A failed compile here is not reported
here: a check already waiting for it gets its error, a later check compiles again and reports it.
A cell over its cell budget (``ahead.why_not``) queues nothing: it will not run. The thread ends
when the queue is empty (a later ``start`` starts another) and is registered with
``attnlab.measure.threads``, whose cancel drops the queued compiles not begun, so no compile is
left inside XLA when the process ends.
"""
from __future__ import annotations

import queue
import threading

import jax

from ..reference import check_programs
from ..reference.output_errors import sample_rows
from . import threads
from .ahead import over_budget, shapes
from .check import semantics
from .inputs import call_extras

_QUEUE: queue.Queue = queue.Queue()
_QUEUED: set = set()
_THREAD: list[threading.Thread] = []
_LOCK = threading.Lock()


def check_shapes(cell) -> tuple:
    """(q, k, v, grads, keyword arguments) of ``check_programs.precompile_check`` for ``cell``'s check."""
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
    return over_budget(cell, opts)


def _work() -> None:
    while True:
        with _LOCK:
            if _QUEUE.empty():
                _THREAD.clear()
                return
            q, k, v, grads, kw = _QUEUE.get()
        try:
            check_programs.precompile_check(q, k, v, grads=grads, **kw)
        except Exception:  # noqa: BLE001 - the cell's own check compiles again and reports it
            pass


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
    """Queue the reference programs of ``cells`` not queued before (GPU only; ``opts``: none of a
    cell over its cell budget); returns how many cells'."""
    if not check or jax.default_backend() != "gpu":
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
