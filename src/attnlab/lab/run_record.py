"""The record of one ``attnlab run`` (``kind: "run"``), and the two ways a run does not start or end.

The run record is the last line of ``results.jsonl``: how long the run took, whether it went on
from a stopped run (``resumed``; ``cells_resumed`` of its cells were measured by that run), which
steps ran and how they ended, the backends measured, where the cells' time went and the
environment. A resumed run can so never be mistaken for a cold one. Imports no JAX.
"""
from __future__ import annotations

import datetime
import os
import shlex

from ..core.records import cost_summary
from ..core.store import read_jsonl


class OutputHasResults(ValueError):
    """The output folder holds results of an earlier run and neither resume nor overwrite was given."""

    def __init__(self, out_dir: str, n: int):
        super().__init__(f"{out_dir} already holds {n} result(s) of an earlier run: give --resume to go on with it "
                         f"(cells measured there are kept), or --overwrite to erase them and start afresh")
        self.out_dir, self.n = out_dir, n


class LabInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``run_lab``: the finished steps, the step it stopped in, the cells kept."""

    def __init__(self, out_dir: str, finished: list[str], stopped_in: str, total: int, cells: int):
        super().__init__(f"stopped in step {stopped_in!r} after {len(finished)} of {total} steps")
        self.out_dir, self.finished, self.stopped_in, self.total, self.cells = out_dir, finished, stopped_in, total, cells


def not_a_run(out_dir: str) -> str | None:
    """Why ``--resume`` cannot go on in ``out_dir``: its results.jsonl holds records that no ``attnlab run`` wrote
    (no run or step record, no sweeps folder: a bench's), which a resumed run would erase; else None."""
    recs = read_jsonl(os.path.join(out_dir, "results.jsonl"))
    if not recs or os.path.exists(os.path.join(out_dir, "sweeps", "results.jsonl")) or any(
            r.get("kind") in ("run", "lab_step") for r in recs):
        return None
    return (f"{out_dir}/results.jsonl holds {len(recs)} record(s) that no attnlab run wrote (a bench's?): --resume "
            f"goes on only with a stopped run; choose another --out, or --overwrite to replace them")


def held_results(out_dir: str) -> int:
    """How many records an earlier run left in ``out_dir`` (its results.jsonl and its sweeps folder)."""
    return len(read_jsonl(os.path.join(out_dir, "results.jsonl"))) + \
        len(read_jsonl(os.path.join(out_dir, "sweeps", "results.jsonl")))


def resume_command(out_dir: str, *, quick: bool = False, sections: list[str] | None = None,
                   label: str | None = None) -> str:
    """The exact command that goes on with a stopped run."""
    parts = ["attnlab", "run", "--out", out_dir, "--resume"]
    if quick:
        parts.append("--quick")
    if sections:
        parts += ["--sections", ",".join(sections)]
    if label:
        parts += ["--label", label]
    return shlex.join(parts)


def run_record(ctx, done: list, chosen: list[str], wall_s: float, *, status: str = "ok",
               stopped_in: str | None = None) -> dict:
    """The ``kind: "run"`` record of a run (``ctx``: its ``LabContext``; ``done``: its finished Sections).

    Cost fields (``cells``, ``compile_s``, ``check_s``, ``timing_s``, ``cell_s``) sum the cells this
    invocation measured, each once (a cell shared by two steps counts once; resumed cells not at all; a program
    compiled once counts once: a cell that ran one an earlier cell compiled, ``program_reused``, adds no compile_s)."""
    measured = list(ctx.measured.values())
    cost = {f: round(sum(r.get(f) or 0.0 for r in measured if not (f == "compile_s" and r.get("program_reused"))), 3)
            for f in ("inputs_s", "compile_s", "check_s", "timing_s", "cell_s")}
    cells = [r for r in ctx.records if r.get("kind") == "cell"]
    return {
        "kind": "run", "status": status, "wall_s": round(wall_s, 3), "resumed": bool(ctx.resume),
        "stopped_in": stopped_in, "quick": ctx.cfg.quick, "gpu": ctx.cfg.gpu,
        "steps": [{"step": s.id, "status": s.status, "seconds": s.facts.get("seconds")} for s in done],
        "steps_chosen": list(chosen), "steps_ok": sum(s.status == "ok" for s in done),
        "backends": sorted({r["backend"] for r in cells}),
        "cells": len(measured), "cells_resumed": len(ctx.resumed), "cells_shown": len(cells), **cost,
        "cost": cost_summary(measured), "label": ctx.label, "env": ctx.env,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
