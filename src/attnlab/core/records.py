"""The schema of a results record, with the invariants that tie its fields to its status.

A *cell record* (one measured sweep cell; ``kind`` absent or ``"cell"``) has the cell's identity
(backend, B, T, S, N, K, H, dtype, causal, window, mode, ...), a ``status`` and the fields that
status allows:

- ``ok``: checked, then timed. ``timer`` names the clock (``cupti``: GPU kernel time by CUPTI;
  ``cuda_events``: CUDA events around the call; ``wall``: host clock around a blocked call) and the
  time field that clock fills (``kernel_ms`` or ``wall_ms``) is a positive number. The correctness
  fields are present: ``checked_fraction`` (1.0 when the whole output was compared), ``rel_err``,
  ``tolerance``, ``checks``; fwd+bwd and bwd cells also ``grad_check == "ok"``.
- ``unchecked``: timed with the check turned off (``--no-check``); no correctness fields claimed.
- ``incorrect``: the check failed; ``reason`` says how; never timed.
- ``unsupported``, ``oom``, ``compile_error``, ``runtime_error``, ``over_budget``: ``reason`` says
  why; never timed.

Timed records also carry the spread of their repeats for the clock that timed them
(``kernel_*`` or ``wall_*``): ``_min_ms``, ``_p25_ms``, ``_p75_ms``, ``_max_ms``, ``_iqr_ms`` and
``_n`` beside the median ``_ms``. ``timing(rec)`` reads them, filling what older files lack
(no ``_p75_ms`` before schema 2's spread fields: ``min(max, median + iqr)``, an upper bound).

The typed form of a cell record (one pydantic model per part: problem, timing, rates, correctness,
memory, cost) is ``attnlab.core.record_model.CellRecord``; its validator holds the rules above, and every
field list (``TIMED_FIELDS``, ``COST_FIELDS``, the CSV's columns, ...) is derived from its parts.

A timed record may not be faster than its device: ``attnlab.core.rate_check`` rejects a rate above the
datasheet peak by more than the timer's noise as an error of attnlab (``RateAbovePeakError``).

Records are validated when written (``attnlab.core.store.ResultStore.append``) and when read
(``attnlab.core.store.read_records``). Files written before this schema (no ``schema`` field, version
1) still load: ``upgrade`` renames their fields and marks what they did not check.
"""
from __future__ import annotations

from .errors import RecordError  # noqa: F401  (re-exported)
from .cell_fields import label_parts
from .problem import label as problem_label
from .record_model import (CellRecord, GRAD_MODES, SCHEMA_VERSION, STATUSES, TIMED_FIELDS, TIMERS,  # noqa: F401
                           Status, fields_where)  # (re-exported: the schema's names, read from here)
from .record_time import time_ms, timing  # noqa: F401  (re-exported)


def is_cell(rec) -> bool:
    return rec.get("kind", "cell") == "cell" and "backend" in rec


def validate(rec: dict | CellRecord, where: str = "") -> dict:
    """Raise ``RecordError`` when ``rec`` (a flat record, as read from JSON, or a ``CellRecord``, checked
    as its flat form) breaks the schema; return the flat record otherwise.

    A cell record is checked by the typed model (``attnlab.core.record_model.CellRecord``: each part's
    types, then its status rules); records of other kinds only name a status."""
    if isinstance(rec, CellRecord):
        rec = rec.flat()
    if not isinstance(rec, dict):
        raise RecordError("<record>", f"must be a JSON object, got {type(rec).__name__}", where)
    if not is_cell(rec):
        if rec.get("kind") in ("lab_step", "memory") and not isinstance(rec.get("status"), str):
            raise RecordError("status", "must be a string", where)
        return rec
    try:
        CellRecord.from_flat(rec)
    except RecordError as e:
        raise type(e)(e.field, e.rule, where) from None   # RateAbovePeakError stays itself
    return rec


def upgrade(rec: dict) -> dict:
    """A record of an older schema in today's field names (a copy; today's records unchanged)."""
    if not is_cell(rec) or (rec.get("schema") or 1) >= SCHEMA_VERSION:
        return rec
    r = dict(rec)
    r["schema"] = 1
    if "runtime_peak_bytes" in r and "process_peak_bytes" not in r:
        # schema 1 stamped the process's high-water mark on every record under this name
        r["process_peak_bytes"] = r.pop("runtime_peak_bytes")
    if "checked_fraction" not in r:
        rows, B, T = r.get("checked_rows"), r.get("batch"), r.get("q_len")
        r["checked_fraction"] = (rows * min(B, 2) / (B * T)) if rows and B and T else None
    if isinstance(r.get("grad_check"), str) and r["grad_check"].startswith("skipped"):
        r["grad_checked_fraction"] = 0.0
    return r


def config_label(rec: dict, mesh: bool = True) -> str:
    """``<problem label> [decode-L] mode [strategy x devices] [inputs=] [cap=] [packing=] [sinks] [kv=] [prefill=]`` of a record or
    ``Cell.identity()``: the one label of a cell everywhere (tables, compare, the lab)."""
    parts = [problem_label(rec)]
    if rec.get("lengths"):
        page = rec.get("page_size") or ""
        parts.append(f"decode-{rec['lengths']}{page}" if rec["lengths"] == "paged" or not page
                     else f"decode-{rec['lengths']}:paged{page}")       # a serving cell's paged cache
    parts.append(rec["mode"])
    if mesh and rec.get("strategy"):
        parts.append(f"{rec['strategy']}x{rec.get('devices', 1)}")
    parts += label_parts(rec)            # inputs=, cap=, packing=, sinks, kv=, prefill=: core.cell_fields
    return " ".join(parts)


#: Wall seconds a cell spent in each phase (``measure_cell`` records them); ``cell_s`` is the whole cell.
#: Derived from the ``phase`` fields of the typed record's Cost part (``attnlab.core.record_model.Cost``).
COST_FIELDS = fields_where("phase")


def cost_split(records) -> dict:
    """Where the cells' wall seconds went (``cell_s`` summed: ``total``), in parts that add up to it:
    ``compile`` (the seconds a cell waited for its compile: ``compile_wait_s``, else ``compile_s``, plus
    ``next_compile_wait_s``, its wait for the next cell's), ``check``, ``timing`` and ``other`` (inputs
    and the rest); beside them ``background``: the compiler's seconds (``compile_s``) that ran in a
    background thread while other cells were measured (``attnlab.measure.ahead``), in none of the parts (a
    cell that ran a program an earlier cell compiled, ``program_reused``, adds none)."""
    cells = [r for r in records if r.get("kind", "cell") == "cell"]
    total = sum(r.get("cell_s") or 0.0 for r in cells)
    waited = sum((r["compile_wait_s"] if r.get("compile_wait_s") is not None else r.get("compile_s") or 0.0)
                 + (r.get("next_compile_wait_s") or 0.0) for r in cells)
    compiler = sum(r.get("compile_s") or 0.0 for r in cells if not r.get("program_reused"))
    parts = {"compile": waited, "check": sum(r.get("check_s") or 0.0 for r in cells),
             "timing": sum(r.get("timing_s") or 0.0 for r in cells)}
    return {"cells": len(cells), "total": total, **parts, "other": max(0.0, total - sum(parts.values())),
            "background": max(0.0, compiler - waited)}


def cost_summary(records, *, resumed: int = 0, resumed_from: str | None = None) -> str:
    """Where a sweep's time went, in one line: ``N cells in X s: compile Y s, check Z s, timing W s, other V s``
    (``cost_split``: the parts add up to X, to the rounding of the last digit), then the compile seconds
    that ran in the background beside other cells where there were any, and ``resumed`` cells (recorded
    by an earlier run in ``resumed_from``, measured not now; ``records`` holds only the cells measured now).

    Records of other kinds (e.g. ``lab_step`` or ``run``) are skipped; a cell without ``cell_s`` counts 0 s."""
    c = cost_split(records)
    more = f"{resumed} resumed from {resumed_from}" if resumed_from else f"{resumed} resumed"
    if not c["cells"] and resumed:
        return f"0 cells measured, {more}"
    r = {k: round(c[k], 1) for k in ("total", "compile", "check", "timing")}
    other = max(0.0, round(r["total"] - r["compile"] - r["check"] - r["timing"], 1))
    text = (f"{c['cells']} cells in {r['total']:.1f} s: compile {r['compile']:.1f} s, check {r['check']:.1f} s, "
            f"timing {r['timing']:.1f} s, other {other:.1f} s")
    if c["background"] >= 0.05:
        text += f" (and {c['background']:.1f} s more compiling in the background, beside other cells)"
    if resumed:
        text += f"; {more}"
    return text