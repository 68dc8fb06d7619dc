"""Measure one sweep cell: check it against the references, then time it, and return one record.

A cell is one (backend, problem, mode[, mesh strategy, decode lengths]); its problem is an
``attnlab.core.problem.Problem``; its record's schema and statuses: ``attnlab.core.record_model``.
An incorrect cell is never timed.

This module is the cell's state machine (the ``Cell`` type: ``cell_type``); every cell takes one path down. Its
run: a serving step's from ``serving_cell`` (its inputs drawn, lengths traced, the step compiled); any other
cell's inputs from ``inputs`` (its input sets and call, made once), then its run from ``jax_cell`` (a JAX call,
compiled) or ``native`` (a backend outside JAX). Then ``check`` checks the run's output, and gradients, against
the references by the check of the cell's kind (the whole output; a quantized KV cache's: ``kv_cells``; a
serving step's sampled requests: ``serving_cell``), and the run's ``time`` times it.
``outcome`` classifies failures, computes the rates and builds the record from the fields measured (only
``_measure_cell`` collects them).
"""
from __future__ import annotations

import contextlib
import time
import traceback

import jax

from .. import backends
from ..core import device
from ..core.record_model import CellRecord
from ..core.records import SCHEMA_VERSION, Status
from . import estimate, jax_cell, native, serving_cell, timers
from .cell_type import IDENTITY, IDENTITY_DEFAULTS, LENGTHS, MODES, Cell, record_key  # noqa: F401  (the type, re-exported)
from .check import check_into
from .inputs import cell_inputs
from .options import Options  # noqa: F401  (re-exported)
from .outcome import MEASURED_FIELDS, Skip as _Skip, _short, finish, rates
from .phases import Phases


def measure_cell(cell: Cell, opts: Options | None = None, *, on_phase=None, compiled=None,
                 stamp: dict | None = None) -> CellRecord:
    """Check then time one cell; always returns its typed record (never raises for a failing cell; a
    record that breaks the schema, e.g. a rate above the device's peak, raises ``RecordError``).

    The whole forward output (and for fwd+bwd / bwd cells every gradient) is checked before any
    timing (``attnlab.measure.check``); an incorrect cell is never timed.

    ``on_phase(name)`` is told when each phase starts (``phases.PHASES``: inputs, compile, check,
    timing); the record gets each phase's seconds (``inputs_s``, ``compile_s``, ``check_s``,
    ``timing_s``) and ``cell_s``. ``compiled``: a ``concurrent.futures.Future`` of
    ``timers.compile_seconds`` for this cell, started ahead (``attnlab.measure.ahead``); its
    failure is the cell's compile failure, exactly as if compiled here. ``stamp``: fields the record
    carries beside what was measured (a sweep's name and env), read when the record is built.

    float64 cells run inside ``jax.enable_x64(True)`` (inputs, compilation, check and timing), so
    their arrays really are float64 whatever the process's x64 setting; the setting is restored
    afterwards. A cell whose inputs or output still come out in another dtype is never timed under
    its label (``unsupported`` / ``incorrect``, saying which dtype JAX produced)."""
    x64 = cell.dtype == "float64" and not jax.config.jax_enable_x64
    with jax.enable_x64(True) if x64 else contextlib.nullcontext():
        return _measure_cell(cell, opts, on_phase, compiled, stamp or {})


def _measure_cell(cell: Cell, opts: Options | None, on_phase, ahead, stamp: dict) -> CellRecord:
    # the fields measured so far: only this function writes them, ``finish`` builds the record from them
    opts = opts or Options()
    info = device.current()
    w = cell.workload
    flops, nbytes = w.flops(cell.mode), w.bytes(cell.mode)
    rec: dict = {"schema": SCHEMA_VERSION, **cell.identity(), **dict.fromkeys(MEASURED_FIELDS),
                 "flops": flops, "bytes": nbytes, "intensity": flops / nbytes}   # as Problem.intensity
    phases = Phases(on_phase)
    no_cupti = timers.kernel_timer_available()
    rec["timer"] = "cupti" if no_cupti is None else "wall"
    status, reason = (Status.OK if opts.check else Status.UNCHECKED), None
    t_start = time.perf_counter()
    try:
        try:
            backend = backends.get(cell.backend)
        except ValueError as e:
            raise _Skip(Status.UNSUPPORTED, str(e))
        if backend.available():   # before the budget: what cannot run here is unsupported, never over budget
            raise _Skip(Status.UNSUPPORTED, f"{cell.backend}: {backend.available()}")
        rec["estimate_s"], over = estimate.over_budget(cell, opts, info)
        if over:
            raise _Skip(Status.OVER_BUDGET, over)
        if serving_cell.is_serving(cell):   # serving_attention on packed requests, lengths traced
            run = serving_cell.compile_run(backend, cell, opts, rec, phases, cupti=no_cupti is None, ahead=ahead)
        else:
            ins = cell_inputs(cell, backend, opts, rec, phases)
            if backend.native:      # asked by cell_inputs already: the run is the call itself
                run = native.NativeRun(backend, cell, ins)
            else:
                run = jax_cell.compile_run(backend, cell, ins, opts, rec, phases, ahead, cupti=no_cupti is None)
        if opts.check:     # an incorrect cell is never timed
            with phases("check"):
                check_into(rec, run, cell, backend, opts)
        run.time(opts, rec, info, phases)
        rec.update(rates(rec, cell, info, backend))
    except _Skip as s:
        rec.update(s.fields)
        status, reason = s.status, s.reason
    except Exception as e:  # noqa: BLE001 - a failing cell must never stop a sweep
        status, reason = Status.RUNTIME_ERROR, _short(f"{type(e).__name__}: {e} | {traceback.format_exc(limit=2)}")
    return finish({**rec, **phases.seconds, **stamp}, status, reason, t_start)

