"""Compile a cell ahead of its turn, in a daemon thread, while the cell before it is measured.

``start(cell)`` returns a ``concurrent.futures.Future`` of ``timers.compile_seconds(timed, args)``
for the cell's timed program, lowered from the shapes of its inputs (``jax.ShapeDtypeStruct``: the
arrays do not exist yet) and compiled AOT, or None where the cell is not compiled that way:

- a backend outside JAX (nothing to compile), a sharded cell (its inputs' placement is part of the
  program), a ``bwd`` cell (its inputs are the forward pass's residuals), a float64 cell (x64 is a
  per-thread setting), or a cell its backend refuses (``why_not`` / ``mode_reason``: it is never
  compiled, so it is not compiled ahead either), or a paged decode cell (its arguments are the pages
  and page table made from its inputs, not q, k, v), or a serving cell on a paged or quantized cache
  or whose program an earlier cell compiled (``serving_cell.why_not_ahead``; a serving cell's step is
  compiled from ``serving_cell.step_shapes``).

For a fwd+bwd cell the future's result has a 4th element where it compiles: the forward program
the check runs, compiled beside it. ``measure_cell(cell, compiled=future)`` takes the result; a failure in the ahead compile is that
cell's ``compile_error`` (or ``oom`` / ``unsupported``, by ``outcome.classify``), nothing else's.
The sweep engine waits for the next cell's compile before the current cell's timing starts: XLA's
GPU autotuner runs candidate kernels on the device while it compiles, and CUPTI would count them,
so the timer still owns the device alone.

A cell that will not run is not compiled ahead: one whose estimate is above ``opts.cell_budget_s``
(``over_budget``) is refused like the others. ``stop()`` cancels the compiles not begun (a cancelled
future raises ``concurrent.futures.CancelledError``) and waits for those under way: a thread still
inside XLA when the interpreter shuts down aborts the process (``attnlab.measure.threads``).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError, Future, wait

import jax
import jax.numpy as jnp

from .. import backends
from ..core import device
from ..core.prepare import prepare
from . import estimate, serving_cell, threads
from .inputs import call_extras
from .jax_cell import functions

#: The compiles started and not yet ended (``stop`` cancels or waits for them).
_JOBS: set = set()
_LOCK = threading.Lock()


class AheadCompile(Future):
    """The future of one ahead compile; ``cancel()`` works until its compile begins."""

    def __init__(self):
        super().__init__()
        self._stop = threading.Event()

    def cancel(self) -> bool:
        self._stop.set()
        return super().cancel()

    def checkpoint(self) -> None:
        """Raise CancelledError in the compiling thread where ``cancel()`` was asked."""
        if self._stop.is_set():
            raise CancelledError("ahead compile cancelled: its cell will not run")


def why_not(cell, opts=None, after=None) -> str | None:
    """Why ``cell`` is not compiled ahead (None: it can be) while the cell ``after`` which it runs is measured;
    with ``opts``, a cell whose estimate is above ``opts.cell_budget_s`` is not (it is recorded over_budget,
    never compiled)."""
    if cell.strategy is not None:
        return "sharded: the placement of its inputs is part of its program"
    if cell.mode == "bwd":
        return "bwd: its inputs are the forward pass's residuals"
    if cell.lengths == "paged":
        return "paged: its arguments are the pages and the page table made from its inputs"
    if cell.kv_dtype:
        return "quantized KV cache: its arguments are the cache and the scales made from its inputs"
    if cell.dtype == "float64":
        return "float64: x64 is set per thread"
    if serving_cell.is_serving(cell):
        try:
            return serving_cell.why_not_ahead(cell, after) or over_budget(cell, opts)
        except ValueError as e:
            return str(e)
    try:
        backend = backends.get(cell.backend)
    except ValueError as e:
        return str(e)
    if backend.native:
        return "not a JAX backend"
    q, k, v = shapes(cell)[:3]
    spec = prepare(q, k, v, is_causal=cell.causal, local_window_size=cell.window).spec
    why = (backend.why_not(spec) if cell.lengths is None else backend.available()) or backend.mode_reason(spec, cell.mode)
    return why or over_budget(cell, opts)


def over_budget(cell, opts) -> str | None:
    """Why ``cell`` will be recorded over_budget and never compiled (``measure_cell``'s own test of its
    estimate against ``opts.cell_budget_s``), or None."""
    if estimate.over_budget(cell, opts, device.current())[1]:
        return f"over the cell budget of {opts.cell_budget_s:g} s: recorded over_budget, never compiled"
    return None


def shapes(cell) -> tuple:
    """The timed program's arguments as ``jax.ShapeDtypeStruct``: (q, k, v) or (q, k, v, float32 cotangent)."""
    B, T, S, N, K, H = cell.batch, cell.q_len, cell.kv_len, cell.heads, cell.kv_heads, cell.head_dim
    dt = jnp.dtype(cell.dtype)
    q, kv = jax.ShapeDtypeStruct((B, T, N, H), dt), jax.ShapeDtypeStruct((B, S, K, H), dt)
    return (q, kv, kv) if cell.mode == "fwd" else (q, kv, kv, jax.ShapeDtypeStruct((B, T, N, H), jnp.float32))


def start(cell, opts=None, after=None) -> AheadCompile | None:
    """Begin compiling ``cell``'s timed program in a registered daemon thread (see module doc) while the cell
    ``after`` is measured; None: not this cell (``why_not(cell, opts, after)``)."""
    try:
        if why_not(cell, opts, after):
            return None
    except Exception:  # noqa: BLE001 - the cell itself will say what is wrong with it
        return None
    fut = AheadCompile()
    fut.set_running_or_notify_cancel()

    def run():
        try:
            fut.checkpoint()
            if serving_cell.is_serving(cell):   # the step on its shapes; its check reads the step's output
                fwd, timed, args = None, serving_cell.step(cell, serving_cell.call_semantics(cell)), \
                    serving_cell.step_shapes(cell)
            else:
                fwd, timed, _ = functions(cell, backends.get(cell.backend), call_extras(cell))
                args = shapes(cell)
            fut.checkpoint()
            t0 = time.perf_counter()
            lowered = jax.jit(timed).lower(*args)
            t1 = time.perf_counter()
            fut.checkpoint()
            result = (lowered.compile(), t1 - t0, time.perf_counter() - t1)   # as timers.compile_seconds
            if cell.mode != "fwd":   # the check's forward output; where it fails, the cell fails on it as always
                try:
                    fut.checkpoint()
                    result = (*result, jax.jit(fwd).lower(*shapes(cell)[:3]).compile())
                except CancelledError:
                    raise
                except Exception:  # noqa: BLE001
                    pass
            fut.set_result(result)
        except BaseException as e:  # noqa: BLE001 - the cell's own failure, raised where it is measured
            fut.set_exception(e)
        finally:
            with _LOCK:
                _JOBS.discard(fut)

    with _LOCK:
        _JOBS.add(fut)
    threads.start(run, f"attnlab-ahead-{cell.backend}", cancel=fut.cancel)
    return fut


def stop(timeout_s: float | None = 0.0) -> int:
    """Cancel the ahead compiles not begun and wait up to ``timeout_s`` seconds (None: no limit) for
    those under way; returns how many are still running."""
    with _LOCK:
        jobs = list(_JOBS)
    for fut in jobs:
        fut.cancel()
    return len(wait(jobs, timeout=timeout_s).not_done) if jobs else 0
