"""The tolerance policy's verdict as a cell's record gives it: one helper for every check of a cell.

``policy_verdict`` judges (rel L2, worst row) errors by the policy (``reference.tolerance.policy_limit``) or a
backend's fixed limit; ``rule_text`` says the rule; ``output_dtype`` and ``judged`` turn an output and a
verdict into the record's fields, raising ``Skip('incorrect')`` carrying them when it fails. ``measure.check``
(the whole output), ``kv_cells`` (a quantized cache) and ``serving_cell`` (a serving step) use them alike.
"""
from __future__ import annotations

import math

import numpy as np

from ..reference.tolerance import LIMIT_FACTOR, policy_limit
from .outcome import Skip, Status


def policy_verdict(err, row, base, base_row, dtype, fixed_limit) -> dict:
    """The tolerance policy's verdict on (rel L2, worst row) errors given the emulation's (or a fixed limit)."""
    if fixed_limit:
        limit, row_limit = fixed_limit, LIMIT_FACTOR * fixed_limit
    else:
        limit, row_limit = policy_limit(dtype, base), policy_limit(dtype, base_row)
    ok = bool(err <= limit and row <= row_limit)
    margin = min(limit / err if err > 0 else math.inf, row_limit / row if row > 0 else math.inf)
    return {"rel_err": err, "row_err": row, "limit": limit, "row_limit": row_limit, "baseline": base,
            "row_baseline": base_row, "margin": margin, "ok": ok}


def rule_text(dtype: str, fixed_limit: float | None, fixed_rule: str | None) -> str:
    """The rule ``policy_verdict`` applied, in words (a backend's own rule for its fixed limit)."""
    if fixed_limit:
        return fixed_rule or f"fixed limit: rel L2 <= {fixed_limit:g}, worst row <= {LIMIT_FACTOR * fixed_limit:g}"
    return (f"{dtype}: rel L2 and worst-row error <= {LIMIT_FACTOR:g} x the kernel-like emulation's "
            f"(scores f32, P rounded to {dtype}, f32 accumulation) + floor")


def errors_text(c: dict) -> str:
    """A verdict's errors beside their limits: "rel L2 E (limit L)[, worst row E (limit L)]"."""
    row = f", worst row {c['row_err']:.3g} (limit {c['row_limit']:.3g})" if c.get("row_limit") is not None else ""
    return f"rel L2 {c['rel_err']:.3g} (limit {c['limit']:.3g})" + row


def output_dtype(out, cell, shape=None) -> dict:
    """``{"out_dtype": ...}`` of a cell's output; ``Skip('incorrect')`` carrying it when the dtype is not the
    cell's (or, given ``shape``, the shape is not that)."""
    fields = {"out_dtype": np.dtype(out.dtype).name}
    if fields["out_dtype"] != cell.dtype or (shape is not None and tuple(out.shape) != tuple(shape)):
        got, want = (fields["out_dtype"], cell.dtype) if shape is None else (
            f"{fields['out_dtype']} {tuple(out.shape)}", f"{cell.dtype} {tuple(shape)}")
        raise Skip(Status.INCORRECT, f"output {got} is not the cell's {want}", fields)
    return fields


def judged(fields: dict, name: str, verdict: dict, tolerance: str, where: str = "") -> dict:
    """The record fields of a check against float64 with one verdict (``policy_verdict``'s dict, or one with
    ok, rel_err, limit and margin): ``fields`` + rel_err, rel_err_f64, margin, tolerance and checks {name:
    verdict}. ``Skip('incorrect')`` carrying them when it fails, naming the errors, their limits and ``where``."""
    fields = {**fields, "rel_err": verdict["rel_err"], "rel_err_f64": verdict["rel_err"],
              "margin": verdict["margin"], "tolerance": tolerance, "checks": {name: verdict}}
    if not verdict["ok"]:
        raise Skip(Status.INCORRECT, f"output wrong{where}: {errors_text(verdict)} ({tolerance})", fields)
    return fields
