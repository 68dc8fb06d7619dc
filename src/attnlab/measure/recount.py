"""Recount a stored record's FLOPs and bytes with today's counter, and its rates with them.

Records store the ``flops`` and ``bytes`` their cell was counted at when measured; a record written
before the counter learned a case (packed documents: ``attnlab.core.pairs``) overstates its rate.
Its identity holds all the counter needs (shape, causal, window, decode lengths, ``packing``: the
documents are seeded by the shape, ``Cell.segment_ids``), so ``recount`` gives the record as today's
counter would have written it; the times are untouched. ``benchmarks/records/recount.py`` applies it
to committed results.
"""
from __future__ import annotations

from ..core.cell_fields import record_values
from ..core.datasheet import peak_for_kind, rates_of
from ..core.problem import Problem
from ..core.rate_check import device_kind
from ..core.records import is_cell, time_ms
from .cell import Cell


def recounted_workload(rec: dict):
    """The ``Problem`` (lengths included) of a record's cell (the mesh left out: it changes no count)."""
    fields = {k: v for k, v in record_values(rec).items() if k not in ("devices", "strategy")}
    return Cell(rec["backend"], problem=Problem.of(rec), mode=rec.get("mode", "fwd"), **fields).workload

def recount(rec: dict) -> dict:
    """A copy of ``rec`` with ``flops``, ``bytes``, ``intensity`` and (timed records) the rates derived from
    them recounted: ``tflops``, ``gbps``, ``pct_peak``, ``pct_bandwidth``, ``roofline_ms``, ``pct_roofline``,
    ``pct_ceiling`` (scaled). Records of other kinds come back unchanged."""
    if not is_cell(rec) or rec.get("flops") is None:
        return rec
    w = recounted_workload(rec)
    mode = rec.get("mode", "fwd")
    out = dict(rec, flops=w.flops(mode), bytes=w.bytes(mode), intensity=w.intensity(mode))
    ms = time_ms(rec)
    if rec.get("tflops") is None or not ms:
        return out
    # the sheet only where the record has the roofline fields: it was measured on a device with one
    sheet = peak_for_kind(device_kind(rec) or "") if rec.get("pct_bandwidth") is not None else None
    out.update(rates_of(out["flops"], out["bytes"], ms, rec.get("peak_tflops"), sheet, rec.get("devices") or 1))
    if rec.get("pct_ceiling") is not None:
        out["pct_ceiling"] = rec["pct_ceiling"] * out["tflops"] / rec["tflops"]
    return out
