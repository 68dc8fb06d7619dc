"""Measure one sweep cell: check it against the references, then time it, and return one record.

A cell is one (backend, problem, mode[, mesh strategy, decode lengths]); its problem is an
``attnlab.core.problem.Problem``; its record's schema and statuses: ``attnlab.core.record_model``.
An incorrect cell is never timed.

This module is the cell and its state machine; the concerns it walks through live beside it:
``inputs`` (input sets, mesh placement, the mode builders), ``check`` (references and the check
policy), ``budget`` (the compile watchdog), ``outcome`` (classification, rates, and the record built
from the fields measured: only ``_measure_cell`` collects them), ``serving_cell`` (a serving step's
cell: lengths traced), ``kv_cells`` (a decode cell on a quantized KV cache).
"""
from __future__ import annotations

import dataclasses
import json
import time
import traceback

import jax
import numpy as np

from .. import backends
from ..core import device, segments, strategies
from ..reference.distributions import DISTRIBUTIONS
from ..reference.inputs import INPUTS_DRAW, cotangent, seed_of
from ..core.problem import FIELDS as PROBLEM_FIELDS, Problem, delegate_fields
from ..core.record_model import CellRecord
from ..core.records import SCHEMA_VERSION, STATUSES, Status, config_label  # noqa: F401  (STATUSES, config_label re-exported)
from ..core.checks import check_soft_cap
from ..core.spec import prepare
from ..api.decode import paged_refusal, window_refusal
from . import check, estimate, kv_cells, memory, serving_cell, timers
from .native_cell import _measure_native
from .options import Options
from .phases import Phases
# re-exported: the names tests, the lab and benchmarks import from attnlab.measure.cell
from .budget import _with_budget, compile_within_budget  # noqa: F401
from .check import check_gradients, check_output, ref_key, semantics  # noqa: F401
from .inputs import _functions, call_extras, _input_sets, _mesh_record, _place_sharded, strategy_refusal  # noqa: F401
from .outcome import MEASURED_FIELDS, TIMING_FIELDS, Skip as _Skip, _short, classify, finish, rates  # noqa: F401

MODES = ("fwd", "fwd+bwd", "bwd")
#: Decode cells (``lengths`` set): the q_len queries are the last tokens of each sequence of the cache.
LENGTHS = ("full", "ragged", "paged")     # paged: full lengths in a paged cache of ``page_size`` (vLLM layout)
#: Read in records written before the field existed as this default (``record_key``).
_SINCE = {"record_default": True}
_UNSET = object()


@dataclasses.dataclass(frozen=True, init=False)
class Cell:
    """``Cell(backend, B, T, S, N, K, H, dtype, causal, window, mode, devices, strategy, lengths, inputs)``
    (positional or keyword, or ``Cell(backend, problem=Problem(...), mode=...)``); the problem's
    fields read as attributes (``cell.batch``, ``cell.window``)."""

    backend: str
    problem: Problem
    mode: str = "fwd"
    devices: int = dataclasses.field(default=1, metadata=_SINCE)                 # mesh size, for sharded cells
    strategy: str | None = dataclasses.field(default=None, metadata=_SINCE)      # None or a registered strategy
    lengths: str | None = dataclasses.field(default=None, metadata=_SINCE)       # None: attention(); full/ragged: decode
    inputs: str = dataclasses.field(default="gaussian", metadata=_SINCE)         # attnlab.reference.distributions name
    page_size: int | None = dataclasses.field(default=None, metadata=_SINCE)     # lengths "paged": tokens per page
    soft_cap: float | None = dataclasses.field(default=None, metadata=_SINCE)    # logits_soft_cap
    packing: str | None = dataclasses.field(default=None, metadata=_SINCE)       # None or "docs:N" (segment ids)
    sinks: bool = dataclasses.field(default=False, metadata=_SINCE)              # reference.inputs.random_sinks
    kv_dtype: str | None = dataclasses.field(default=None, metadata=_SINCE)      # decode: a quantized cache's dtype
    kv_scale: str | None = dataclasses.field(default=None, metadata=_SINCE)      # and its scale layout (kv_cells)
    prefill_chunks: str | None = dataclasses.field(default=None, metadata=_SINCE)  # serving cells: "NxSIZE"

    def __init__(self, backend, batch=_UNSET, q_len=_UNSET, kv_len=_UNSET, heads=_UNSET, kv_heads=_UNSET,
                 head_dim=_UNSET, dtype=_UNSET, causal=_UNSET, window=_UNSET, mode="fwd", devices=1, strategy=None,
                 lengths=None, inputs="gaussian", page_size=None, soft_cap=None,
                 packing=None, kv_dtype=None, kv_scale=None, prefill_chunks=None, *, problem: Problem | None = None,
                 sinks=False):
        given = {k: v for k, v in zip(PROBLEM_FIELDS, (batch, q_len, kv_len, heads, kv_heads, head_dim, dtype, causal,
                                                       window)) if v is not _UNSET}
        if problem is None:
            problem = Problem(**{f: given.get(f) for f in PROBLEM_FIELDS[:6]},
                              **{f: given[f] for f in PROBLEM_FIELDS[6:] if f in given})
        elif given:  # dataclasses.replace(cell, heads=...)
            problem = dataclasses.replace(problem, **given)
        for name, value in (("backend", backend), ("problem", problem), ("mode", mode), ("devices", devices),
                            ("strategy", strategy), ("lengths", lengths), ("inputs", inputs), ("page_size", page_size),
                            ("soft_cap", None if soft_cap is None else float(soft_cap)), ("packing", packing),
                            ("sinks", sinks), *kv_cells.cell_fields(kv_dtype, kv_scale),
                            ("prefill_chunks", prefill_chunks)):
            object.__setattr__(self, name, value)
        self._validate()

    def _validate(self):
        if self.inputs not in DISTRIBUTIONS:
            raise ValueError(f"inputs must be one of {DISTRIBUTIONS}, got {self.inputs!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.lengths is not None:
            if self.lengths not in LENGTHS and not serving_cell.is_serving(self):
                raise ValueError(f"lengths must be None, one of {LENGTHS + serving_cell.LENGTHS} or file:PATH, "
                                 f"got {self.lengths!r}")
            if self.q_len > self.kv_len or self.strategy is not None:
                raise ValueError("decode cells (lengths) need q_len <= kv_len and no strategy")
        if (self.lengths == "paged") != (self.page_size is not None) and not serving_cell.is_serving(self):
            raise ValueError(f"page_size is given exactly for lengths 'paged' (or serving), got lengths={self.lengths!r}, "
                             f"page_size={self.page_size!r}")
        if self.page_size is not None and (self.page_size < 1 or self.kv_len % self.page_size):
            raise ValueError(f"page_size must divide kv_len={self.kv_len}, got {self.page_size}")
        check_soft_cap(self.soft_cap)       # None passes
        serving_cell.check_cell(self)
        if self.packing is not None:
            segments.parse_packing(self.packing)
            if self.q_len != self.kv_len or self.lengths is not None or self.strategy is not None:
                raise ValueError("packing needs q_len == kv_len, no decode lengths and no strategy")
        kv_cells.validate(self)
        if self.strategy is not None and self.strategy not in strategies.names():
            raise ValueError(strategies.unknown(self.strategy))
        if self.strategy is None and self.devices != 1:
            raise ValueError("devices > 1 needs a strategy (batch, heads or ring)")

    def kv_lengths(self) -> tuple[int, ...] | None:
        """Decode cells: each sequence's valid cache length (the q_len new tokens included).

        "full": every sequence fills the cache (S). "ragged": lengths drawn uniformly from [T, S]
        with a seed fixed by the shape, so every backend and every run sees the same batch."""
        if self.lengths is None or self.lengths in ("full", "paged"):
            return None if self.lengths is None else (self.kv_len,) * self.batch
        if serving_cell.is_serving(self):   # a serving cell: every request's, the prefill chunks first
            return tuple(serving_cell.requests(self)[1].tolist())
        rng = np.random.default_rng(seed_of(f"ragged B{self.batch} T{self.q_len} S{self.kv_len}"))
        return tuple(int(x) for x in rng.integers(self.q_len, self.kv_len + 1, size=self.batch))

    def segment_ids(self) -> np.ndarray | None:
        """(B, T) int32 ids of ``packing`` ("docs:N": N contiguous documents of random lengths per row,
        seeded by the shape, so every backend and run sees the same packing), or None."""
        if (n := segments.parse_packing(self.packing)) is None:
            return None
        return segments.docs(self.batch, self.q_len, n, seed_of(f"packing {self.packing} B{self.batch} T{self.q_len}"))

    @property
    def workload(self) -> Problem:
        """The problem with the cell's decode lengths and documents (what its FLOPs and bytes count)."""
        if serving_cell.is_serving(self):
            return serving_cell.problem_of(self)
        docs = segments.run_lengths(self.segment_ids()) if self.packing else None   # packed: pairs within documents
        return dataclasses.replace(self.problem, kv_lengths=self.kv_lengths(), decode=self.lengths is not None,
                                   doc_lengths=docs, kv_dtype=self.kv_dtype, kv_scale=self.kv_scale,
                                   page_size=self.page_size)

    def identity(self) -> dict:
        """The record's identity fields in order, the problem's as ``Problem.identity`` spells them."""
        return {**{k: getattr(self, k) for k in IDENTITY}, **self.problem.identity()}

    def key(self) -> str:
        return json.dumps(self.identity(), sort_keys=True)

    @property
    def config_label(self) -> str:
        return config_label(self.identity())


delegate_fields(Cell)

#: A record's identity: the Cell's fields in order, its problem spelled out as the Problem's fields.
IDENTITY = tuple(n for f in dataclasses.fields(Cell) for n in (PROBLEM_FIELDS if f.name == "problem" else (f.name,)))
#: Identity fields older records may lack, read as the Cell's defaults.
IDENTITY_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Cell) if f.metadata.get("record_default")}


def record_key(rec: dict) -> str:
    d = {k: rec.get(k, IDENTITY_DEFAULTS.get(k)) for k in IDENTITY}
    d["window"] = list(d["window"]) if d["window"] else None
    return json.dumps(d, sort_keys=True)


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
