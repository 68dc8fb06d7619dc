"""The tolerance policy's verdict as a cell's record gives it: one helper for every check of a cell.

``policy_verdict`` (``reference.tolerance``, re-exported) judges (rel L2, worst row) errors by the policy or a
backend's fixed limit; ``rule_text`` says the rule; ``judged`` turns a verdict into the record's fields, raising
``Skip('incorrect')`` carrying them when it fails: ``kv_cells`` (a quantized cache) and ``serving_cell`` (a serving
step) use it alike (``measure.check``, the whole output, judges by ``policy_verdict`` too).
"""
from __future__ import annotations

from ..reference.tolerance import errors_text, policy_verdict, rule_text  # noqa: F401  (re-exported)
from .outcome import Skip, Status


def judged(fields: dict, name: str, verdict: dict, tolerance: str, where: str = "") -> dict:
    """The record fields of a check against float64 with one verdict (``policy_verdict``'s dict, or one with
    ok, rel_err, limit and margin): ``fields`` + rel_err, rel_err_f64, margin, tolerance and checks {name:
    verdict}. ``Skip('incorrect')`` carrying them when it fails, naming the errors, their limits and ``where``."""
    fields = {**fields, "rel_err": verdict["rel_err"], "rel_err_f64": verdict["rel_err"],
              "margin": verdict["margin"], "tolerance": tolerance, "checks": {name: verdict}}
    if not verdict["ok"]:
        raise Skip(Status.INCORRECT, f"output wrong{where}: {errors_text(verdict)} ({tolerance})", fields)
    return fields
