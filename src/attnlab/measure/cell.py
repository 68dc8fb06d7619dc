"""Measure one sweep cell: check it against the references, then time it, and return one record.

A cell is one (backend, problem, mode[, mesh strategy, decode lengths]); its problem is an
``attnlab.core.problem.Problem``; its record's schema and statuses: ``attnlab.core.record_model``.
An incorrect cell is never timed.

This module is the cell's state machine (the ``Cell`` type: ``cell_type``); the concerns it walks through live beside it:
``inputs`` (input sets, mesh placement, the mode builders), ``check`` (references and the check
policy), ``budget`` (the compile watchdog), ``outcome`` (classification, rates, and the record built
from the fields measured: only ``_measure_cell`` collects them), ``serving_cell`` (a serving step's
cell: lengths traced), ``kv_cells`` (a decode cell on a quantized KV cache).
"""
from __future__ import annotations

import dataclasses
import time
import traceback

import jax
import numpy as np

from .. import backends
from ..core import device
from ..reference.inputs import INPUTS_DRAW, cotangent
from ..core.record_model import CellRecord
from ..core.records import SCHEMA_VERSION, Status
from ..core.prepare import prepare
from ..api.decode import paged_refusal, window_refusal
from . import estimate, kv_cells, memory, serving_cell, timers
from .budget import compile_within_budget
from .cell_type import IDENTITY, IDENTITY_DEFAULTS, LENGTHS, MODES, Cell, record_key  # noqa: F401  (the type, re-exported)
from .check import check_gradients, check_output
from .inputs import _functions, call_extras, _input_sets, _mesh_record, _place_sharded, strategy_refusal
from .native_cell import _measure_native
from .options import Options  # noqa: F401  (re-exported)
from .outcome import MEASURED_FIELDS, Skip as _Skip, _short, classify, finish, rates
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
    if cell.dtype == "float64" and not jax.config.jax_enable_x64:
        with jax.enable_x64(True):
            return _measure_cell(cell, opts, on_phase, compiled, stamp or {})
    return _measure_cell(cell, opts, on_phase, compiled, stamp or {})


def _measure_cell(cell: Cell, opts: Options | None, on_phase, ahead, stamp: dict) -> CellRecord:
    # the fields measured so far: only this function writes them, ``finish`` builds the record from them
    opts = opts or Options()
    info = device.current()
    w = cell.workload
    rec: dict = {"schema": SCHEMA_VERSION, **cell.identity(), **dict.fromkeys(MEASURED_FIELDS),
                 "flops": w.flops(cell.mode), "bytes": w.bytes(cell.mode), "intensity": w.intensity(cell.mode)}
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
        if opts.cell_budget_s:
            est = estimate.estimate_cell(cell, opts, info)
            rec["estimate_s"] = est.seconds
            if est.seconds > opts.cell_budget_s:
                raise _Skip(Status.OVER_BUDGET, f"estimated {est.text()} on {info.kind or info.platform}: more "
                                                f"than the cell budget of {opts.cell_budget_s:g} s (--cell-budget); not run")
        if serving_cell.is_serving(cell):   # serving_attention on packed requests, lengths traced
            serving_cell.measure(backend, cell, opts, rec, info, phases)
            return finish({**rec, **phases.seconds, **stamp}, status, reason, t_start)
        with phases("inputs"):
            try:
                sets = _input_sets(cell, opts)
            except Exception as e:  # noqa: BLE001
                raise _Skip(*classify(e, "run"))
        rec.update(input_sets=len(sets), inputs_draw=INPUTS_DRAW)
        q0, k0, v0 = sets[0]
        if np.dtype(q0.dtype).name != cell.dtype:
            raise _Skip(Status.UNSUPPORTED, f"dtype {cell.dtype}: JAX made {np.dtype(q0.dtype).name} inputs "
                                            f"(jax_enable_x64={jax.config.jax_enable_x64}); not run under a wrong label")
        spec = prepare(q0, k0, v0, is_causal=cell.causal, local_window_size=cell.window, **call_extras(cell)).spec
        # decode cells: the backend's refusal comes from decode_attention itself when it is traced
        why = backend.why_not(spec) if cell.lengths is None else backend.available()
        if not why and cell.lengths is not None:
            why = window_refusal(backend, cell.window) or (paged_refusal(backend) if cell.lengths == "paged" else None)
        why = why or backend.mode_reason(spec, cell.mode)
        if why:
            raise _Skip(Status.UNSUPPORTED, f"{cell.backend}: {why}")
        if cell.strategy is not None:
            rec["mesh"] = _mesh_record(cell)
            sets = _place_sharded(sets, cell)
            q0, k0, v0 = sets[0]
            if why_strategy := strategy_refusal(cell):
                raise _Skip(Status.UNSUPPORTED, why_strategy)
        if backend.native:
            if cell.lengths is not None and not backend.decode:
                raise _Skip(Status.UNSUPPORTED, f"{cell.backend}: no decode (cache) semantics")
            rec.update(_measure_native(backend, cell, spec, sets, opts, rec, info, phases))
            return finish({**rec, **phases.seconds, **stamp}, status, reason, t_start)
        fwd, timed, make_args = _functions(cell)
        with phases("inputs"):
            cts = [cotangent(opts.seed + 100 + i, q.shape) if cell.mode != "fwd" else None  # fwd: unused
                   for i, (q, _, _) in enumerate(sets)]
            try:
                arg_sets = [make_args(q, k, v, ct) for (q, k, v), ct in zip(sets, cts)]
            except Exception as e:  # noqa: BLE001
                raise _Skip(*classify(e, "compile"))
        with phases("compile", key="compile_wait_s"):
            try:
                compiled, lower_s, compile_s, *fwd_ahead = compile_within_budget(timed, arg_sets[0], opts.compile_budget_s, ahead)
            except _Skip:
                raise
            except Exception as e:  # noqa: BLE001
                raise _Skip(*classify(e, "compile"))
        rec.update(lower_s=lower_s, compile_s=lower_s + compile_s, compiled_ahead=ahead is not None)
        rec.update(memory.compiled_memory(compiled))
        limit = opts.max_bytes or memory.device_bytes_limit()
        if limit and rec["peak_bytes"] and rec["peak_bytes"] > limit:
            raise _Skip(Status.OOM, f"compiled peak {rec['peak_bytes']} bytes > device limit {limit} bytes; not run")
        if opts.check:
            with phases("check"):
                try:
                    out = (compiled(*arg_sets[0]) if cell.mode == "fwd"     # paged cells: (q, pages, table)
                           else (fwd_ahead[0] if fwd_ahead else jax.jit(fwd))(q0, k0, v0))
                    rec.update((kv_cells.check_output if cell.kv_dtype else check_output)(out, sets[0], cell, backend,
                                                                                          opts))
                    if cell.mode != "fwd":
                        rec.update(check_gradients(compiled(*arg_sets[0]), sets[0], cts[0], cell, opts))
                except _Skip:
                    raise
                except Exception as e:  # noqa: BLE001
                    raise _Skip(*classify(e, "run"))
        try:
            facts = backend.facts(fwd, q0, k0, v0, fwd_as=lambda name: _functions(dataclasses.replace(cell, backend=name))[0])
        except Exception as e:  # noqa: BLE001 - a fact that cannot be read is reported, not fatal
            facts = {"error": _short(f"{type(e).__name__}: {e}", 200)}
        rec.update({"facts": facts} if facts else {})
        rec["repeats"] = opts.repeats or (20 if info.platform == "gpu" else 5)
        with phases("timing"):
            try:
                timers.time_into(rec, compiled, arg_sets, opts, cupti=no_cupti is None)
            except Exception as e:  # noqa: BLE001
                raise _Skip(*classify(e, "run"))
        rec["process_peak_bytes"] = memory.process_peak_bytes()
        rec.update(rates(rec, cell, info, backend))
    except _Skip as s:
        rec.update(s.fields)
        status, reason = s.status, s.reason
    except Exception as e:  # noqa: BLE001 - a failing cell must never stop a sweep
        status, reason = Status.RUNTIME_ERROR, _short(f"{type(e).__name__}: {e} | {traceback.format_exc(limit=2)}")
    return finish({**rec, **phases.seconds, **stamp}, status, reason, t_start)
