"""The typed cell record: one pydantic model per part, a ``CellRecord`` that ties the parts to a status.

On disk a record stays FLAT (one JSON object a line: CSV, compare and pandas read it as is);
``CellRecord.from_flat(rec)`` splits it into its parts by field name and ``.flat()`` gives it back.
Every field list of the code is derived from these models (``fields_where``), never written by hand:

``Problem``: the identity (backend, B, T, S, N, K, H, dtype, causal, window, mode, ``core.cell_fields``); ``Timing``:
the clock, the repeats' ms (median, spread); ``Rates``: TFLOP/s, GB/s, % of peak and roofline, FLOPs, bytes;
``Correctness``: the check; ``Memory``: bytes used; ``Cost``: wall seconds per phase, how it was compiled.

Field metadata: ``timed`` (only a timed record may set it), ``measured`` (every cell record has it, None until
measured), ``cleared`` (None when not timed), ``phase`` (a cost phase summed by ``records.cost_summary``), ``csv``
(a top-level extra in the CSV). Unknown top-level fields are kept; a part forbids unknown fields.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model, StrictBool, StrictInt, StrictStr, ValidationError, model_validator

from .cell_fields import CELL_FIELDS
from .errors import RecordError
from .rate_check import check_rates
from .status import GRAD_MODES, STATUSES, TIMERS, Status  # noqa: F401  (STATUSES re-exported)

Num = Optional[int | float]   # an int stays an int (the JSON written is what was measured)
SCHEMA_VERSION = 2


def _f(*flags: str, default=None):
    return Field(default, json_schema_extra={f: True for f in flags} or None)


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Shape(_Part):
    backend: StrictStr
    batch: StrictInt
    q_len: StrictInt
    kv_len: StrictInt
    heads: StrictInt
    kv_heads: StrictInt
    head_dim: StrictInt
    dtype: StrictStr
    causal: StrictBool
    window: Any = None  # null or [left, right]: checked by the status rules
    mode: StrictStr


#: The cell's identity: the shape, then the fields of ``core.cell_fields``, then ``request_lengths`` (a decode or
#: serving cell's per-request lengths: ``core.problem.Problem.lengths_record``) and ``lengths_traced`` (the lengths
#: were a traced argument of the jitted call, a server's way).
Problem = create_model("Problem", __base__=_Shape, **{f.name: (f.type, f.default) for f in CELL_FIELDS},
                       request_lengths=(Optional[dict], None), lengths_traced=(Optional[bool], None))


_SPREAD = ("min", "p25", "p75", "max", "iqr")


class Timing(_Part):
    timer: Optional[str] = None
    timer_note: Optional[str] = None
    kernel_ms: Num = _f("timed", "measured", "cleared")
    wall_ms: Num = _f("timed", "measured", "cleared")
    pipelined_ms: Num = _f("timed", "measured", "cleared")
    dispatch_ms: Num = _f("timed", "measured", "cleared")
    kernel_min_ms: Num = _f("timed")
    kernel_p25_ms: Num = _f("timed")
    kernel_p75_ms: Num = _f("timed")
    kernel_max_ms: Num = _f("timed")
    kernel_iqr_ms: Num = _f("timed")
    kernel_n: Optional[int] = _f("timed")
    wall_min_ms: Num = _f("timed")
    wall_p25_ms: Num = _f("timed")
    wall_p75_ms: Num = _f("timed")
    wall_max_ms: Num = _f("timed")
    wall_iqr_ms: Num = _f("timed")
    wall_n: Optional[int] = _f("timed")
    repeats: Optional[int] = _f("timed")
    pipelined_calls: Optional[int] = _f("timed")


class Rates(_Part):
    tflops: Num = _f("timed", "measured", "cleared")
    gbps: Num = _f("timed", "measured", "cleared")
    pct_peak: Num = _f("timed", "measured", "cleared")
    peak_dtype: Optional[str] = None
    peak_tflops: Num = None
    pct_ceiling: Num = _f("timed", "measured", "cleared")
    pct_bandwidth: Num = _f("timed", "cleared")
    roofline_ms: Num = _f("cleared")
    pct_roofline: Num = _f("timed", "cleared")
    flops: Num = None
    bytes: Num = None
    intensity: Num = None
    tokens_per_s: Num = _f("timed", "cleared")   # serving cells: the step's new tokens / its time


class Correctness(_Part):
    checked_fraction: Num = _f("measured")
    checked_rows: Optional[int] = None
    rel_err: Num = _f("measured")
    row_err: Num = None
    rel_err_f64: Num = None
    max_abs_err: Num = _f("measured")
    margin: Num = None
    tolerance: Optional[str] = None
    checks: Optional[dict] = None
    grad_check: Optional[str] = _f("measured")
    grad_rel_err: Num = None
    grad_margin: Num = None
    grad_checked_fraction: Num = None
    same_as: Optional[str] = None
    kv_rel_err: Num = None              # a quantized cache: rel L2 vs float64 of the unquantized K/V
    grad_checks: Optional[dict] = None  # per gradient tensor: its errors, limits and verdict
    out_dtype: Optional[str] = None     # the output's dtype, as the check read it


class Memory(_Part):
    temp_bytes: Optional[int] = _f("measured")
    peak_bytes: Optional[int] = _f("measured")
    runtime_peak_bytes: Optional[int] = None
    process_peak_bytes: Optional[int] = _f("measured")
    runtime_peak_scope: Optional[str] = None
    torch_peak_bytes: Optional[int] = None
    argument_bytes: Optional[int] = None
    output_bytes: Optional[int] = None


class Cost(_Part):
    inputs_s: Num = _f("measured", "phase")
    check_s: Num = _f("measured", "phase")
    timing_s: Num = _f("measured", "phase")
    cell_s: Num = _f("phase")
    lower_s: Num = _f("measured")
    compile_s: Num = _f("measured", "phase")
    compile_wait_s: Num = None
    check_parts_s: Optional[dict] = None   # of check_s: references made for this cell (reference_s, float64_rows_s)
    next_compile_wait_s: Num = None   # of cell_s: waiting for the next cell's ahead compile (its compile)
    compiled_ahead: Optional[bool] = None
    program_reused: Optional[bool] = None   # its program compiled by an earlier cell (compile_s: that compile)
    estimate_s: Num = None


#: part name -> model, in the order ``flat()`` and the CSV list them
PARTS: dict[str, type[_Part]] = dict(problem=Problem, timing=Timing, rates=Rates, correctness=Correctness, memory=Memory, cost=Cost)
_PART_OF = {name: part for part, model in PARTS.items() for name in model.model_fields}


def fields_where(flag: str, parts=tuple(PARTS)) -> tuple[str, ...]:
    """Names of the flat fields whose metadata sets ``flag``, in declaration order."""
    return tuple(n for p in parts for n, f in PARTS[p].model_fields.items() if (f.json_schema_extra or {}).get(flag))


TIMED_FIELDS = fields_where("timed")     # fields only a timed record may set


class CellRecord(BaseModel, Mapping):
    """A cell record: ``status``, ``reason``, the parts and the top-level extras (unknown ones kept).

    Frozen, and valid by construction: its validator holds the status rules (``attnlab.core.records``'
    docstring says them in words), so a record that breaks one cannot be built. It reads as the flat
    record, a read-only ``Mapping`` (``rec["kernel_ms"]``, ``rec.get("facts")``: the names on disk;
    ``status`` is the ``Status``); ``with_fields(**flat)`` is a new record, validated again."""
    model_config = ConfigDict(extra="allow", frozen=True)

    status: Status
    reason: Optional[str] = None
    problem: Problem
    timing: Timing = Timing()
    rates: Rates = Rates()
    correctness: Correctness = Correctness()
    memory: Memory = Memory()
    cost: Cost = Cost()
    input_sets: Any = _f("csv")
    mesh: Any = _f("csv")
    sweep: Any = _f("csv")
    schema_: Optional[int] = Field(None, alias="schema", json_schema_extra={"csv": True})
    timestamp: Optional[str] = _f("csv")
    env: Optional[dict] = _f("csv")
    inputs_draw: Any = _f("csv")
    kind: Optional[str] = None
    facts: Optional[dict] = _f("csv")
    label: Optional[str] = None

    @model_validator(mode="after")
    def _status_rules(self):
        """The rules that tie the fields to the status; raise ``RecordError`` naming the field."""
        rec, status = self.flat(), self.status
        w = self.problem.window
        if w is not None and (not isinstance(w, (list, tuple)) or len(w) != 2):
            raise RecordError("window", f"must be null or [left, right], got {w!r}")
        if status.timed:
            if self.reason is not None:
                raise RecordError("reason", f"must be null for status {status.value!r}")
            if self.timing.timer not in TIMERS:
                raise RecordError("timer", f"must name the clock ({', '.join(TIMERS)}) of a timed record, "
                                           f"got {self.timing.timer!r}")
            for f in {TIMERS[self.timing.timer], *(f for f in TIMERS.values() if rec.get(f) is not None)}:
                _number(rec, f, positive=True)     # the headline time, and any other clock's it carries
            check_rates(rec)
            if status is Status.OK and (self.schema_ or 1) >= SCHEMA_VERSION:   # older files (no schema) did not check
                _number(rec, "rel_err")
                _number(rec, "checked_fraction", positive=True)
                c = self.correctness
                if not isinstance(c.tolerance, str) or not isinstance(c.checks, dict):
                    raise RecordError("checks", "an ok record names its tolerance and each reference's verdict")
                if self.problem.mode in GRAD_MODES and c.grad_check != "ok":
                    raise RecordError("grad_check", f"must be 'ok' for an ok {self.problem.mode} record, "
                                                    f"got {c.grad_check!r}")
        else:
            if not isinstance(self.reason, str) or not self.reason:
                raise RecordError("reason", f"status {status.value!r} needs a reason")
            timed = [f for f in TIMED_FIELDS if rec.get(f) is not None]
            if timed:
                raise RecordError(timed[0], f"must be null: a record with status {status.value!r} is never timed")
        return self

    @classmethod
    def from_flat(cls, rec: dict) -> "CellRecord":
        """Split a flat record into its parts; raises ``RecordError`` naming the field."""
        nested: dict[str, Any] = {p: {} for p in PARTS}
        for k, v in rec.items():
            if k in _PART_OF:
                nested[_PART_OF[k]][k] = v
            else:
                nested[k] = v
        try:
            return cls.model_validate(nested)
        except ValidationError as e:
            raise _record_error(e) from None

    def flat(self) -> dict:
        """The flat record (field names as on disk, ``status`` its string); unset optional fields are left out."""
        out = {"status": self.status.value, "reason": self.reason}
        for p in PARTS:
            out.update(getattr(self, p).model_dump(exclude_unset=True))
        out.update(self.model_dump(include=_top_fields(self), by_alias=True, exclude_unset=True))
        return out

    def with_fields(self, **fields) -> "CellRecord":
        """A new record: this one's flat fields with ``fields`` added or replaced, validated."""
        return CellRecord.from_flat({**self.flat(), **fields})

    # read-only Mapping of the flat fields (``Problem.of``, pandas and the report read records so)
    def _view(self) -> dict:
        return {**self.flat(), "status": self.status}

    def __getitem__(self, name: str):
        return self.status if name == "status" else self.flat()[name]

    def __iter__(self):
        return iter(self.flat())

    def __len__(self) -> int:
        return len(self.flat())

    def keys(self):
        return self._view().keys()

    def items(self):
        return self._view().items()

    def values(self):
        return self._view().values()


def _number(rec: dict, field: str, positive: bool = False) -> None:
    x = rec.get(field)
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or (positive and x <= 0):
        raise RecordError(field, f"must be a {'positive ' if positive else ''}finite number for status "
                                 f"{rec.get('status')!r}, got {x!r}")


def _top_fields(rec: CellRecord) -> set:
    return {k for k in rec.model_fields_set if k not in PARTS and k not in ("status", "reason")} | set(rec.model_extra or {})


def _record_error(e: ValidationError):
    err = e.errors()[0]
    orig = (err.get("ctx") or {}).get("error")
    if isinstance(orig, RecordError):
        return orig
    loc = [str(x) for x in err["loc"][:2] if not isinstance(x, int)]   # (part, field): no union member's tag
    field = loc[-1] if loc else "<record>"
    msg = [x["msg"] for x in e.errors() if x["loc"][:2] == err["loc"][:2]][-1]   # an int | float: the float's
    return RecordError(field, f"{msg}, got {err.get('input')!r}")


def csv_columns(identity) -> list[str]:
    """The CSV's columns: the cell identity, status and reason, each part's fields in declaration order
    (identity ones not repeated), then the top-level extras marked ``csv``."""
    names = list(identity) + ["status", "reason"]
    names += [n for p in PARTS for n in PARTS[p].model_fields if n not in names]
    names += [f.alias or n for n, f in CellRecord.model_fields.items() if (f.json_schema_extra or {}).get("csv")]
    return names
