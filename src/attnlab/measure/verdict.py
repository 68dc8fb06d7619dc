"""The tolerance policy's verdict as a cell's record gives it: one helper for every check of a cell.

``policy_verdict`` (``reference.tolerance``, re-exported) judges (rel L2, worst row) errors by the policy or a
backend's fixed limit; ``rule_text`` says the rule; ``output_dtype`` and ``judged`` turn an output and a
verdict into the record's fields, raising ``Skip('incorrect')`` carrying them when it fails. ``measure.check``
(the whole output), ``kv_cells`` (a quantized cache) and ``serving_cell`` (a serving step) use them alike.
"""
from __future__ import annotations

import numpy as np

from ..reference.tolerance import errors_text, policy_verdict, rule_text  # noqa: F401  (re-exported)
from .outcome import Skip, Status


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
