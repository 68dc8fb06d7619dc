"""Compile a cell ahead of its turn, in a daemon thread, while the cell before it is measured.

``start(cell)`` returns a ``concurrent.futures.Future`` of ``timers.compile_seconds(timed, args)``
for the cell's timed program, lowered from the shapes of its inputs (``jax.ShapeDtypeStruct``: the
arrays do not exist yet) and compiled AOT, or None where the cell is not compiled that way:

- a backend outside JAX (nothing to compile), a sharded cell (its inputs' placement is part of the
  program), a ``bwd`` cell (its inputs are the forward pass's residuals), a float64 cell (x64 is a
  per-thread setting), or a cell its backend refuses (``why_not`` / ``mode_reason``: it is never
  compiled, so it is not compiled ahead either), or a paged decode cell (its arguments are the pages
  and page table made from its inputs, not q, k, v).

For a fwd+bwd cell the future's result has a 4th element where it compiles: the forward program
the check runs, compiled beside it. ``measure_cell(cell, compiled=future)`` takes the result; a failure in the ahead compile is that
cell's ``compile_error`` (or ``oom`` / ``unsupported``, by ``record.classify``), nothing else's.
The sweep engine waits for the next cell's compile before the current cell's timing starts: XLA's
GPU autotuner runs candidate kernels on the device while it compiles, and CUPTI would count them,
so the timer still owns the device alone.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future

import jax
import jax.numpy as jnp

from .. import backends
from ..core.spec import prepare


def why_not(cell) -> str | None:
    """Why ``cell`` is not compiled ahead (None: it can be)."""
    if cell.strategy is not None:
        return "sharded: the placement of its inputs is part of its program"
    if cell.mode == "bwd":
        return "bwd: its inputs are the forward pass's residuals"
    if cell.lengths == "paged":
        return "paged: its arguments are the pages and the page table made from its inputs"
    if cell.dtype == "float64":
        return "float64: x64 is set per thread"
    try:
        backend = backends.get(cell.backend)
    except ValueError as e:
        return str(e)
    if backend.native:
        return "not a JAX backend"
    q, k, v = shapes(cell)[:3]
    spec = prepare(q, k, v, is_causal=cell.causal, local_window_size=cell.window).spec
    return (backend.why_not(spec) if cell.lengths is None else backend.available()) or backend.mode_reason(spec, cell.mode)


def shapes(cell) -> tuple:
    """The timed program's arguments as ``jax.ShapeDtypeStruct``: (q, k, v) or (q, k, v, float32 cotangent)."""
    B, T, S, N, K, H = cell.batch, cell.q_len, cell.kv_len, cell.heads, cell.kv_heads, cell.head_dim
    dt = jnp.dtype(cell.dtype)
    q, kv = jax.ShapeDtypeStruct((B, T, N, H), dt), jax.ShapeDtypeStruct((B, S, K, H), dt)
    return (q, kv, kv) if cell.mode == "fwd" else (q, kv, kv, jax.ShapeDtypeStruct((B, T, N, H), jnp.float32))


def start(cell) -> Future | None:
    """Begin compiling ``cell``'s timed program in a daemon thread (see module doc); None: not this cell."""
    from .inputs import _functions
    from .timers import compile_seconds

    try:
        if why_not(cell):
            return None
    except Exception:  # noqa: BLE001 - the cell itself will say what is wrong with it
        return None
    fut: Future = Future()
    fut.set_running_or_notify_cancel()

    def run():
        try:
            fwd, timed, _ = _functions(cell)
            result = compile_seconds(timed, shapes(cell))
            if cell.mode != "fwd":   # the check's forward output; where it fails, the cell fails on it as always
                try:
                    result = (*result, jax.jit(fwd).lower(*shapes(cell)[:3]).compile())
                except Exception:  # noqa: BLE001
                    pass
            fut.set_result(result)
        except BaseException as e:  # noqa: BLE001 - the cell's own failure, raised where it is measured
            fut.set_exception(e)

    threading.Thread(target=run, daemon=True, name=f"attnlab-ahead-{cell.backend}").start()
    return fut
