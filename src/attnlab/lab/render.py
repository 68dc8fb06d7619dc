"""The lab's sections from records: each step's pure renderer (``attnlab.lab.steps``), over a run.

Pure: no JAX is imported here (nor by anything this imports), nothing is measured. A renderer
takes the run's records (the lines of results.jsonl: cell records tagged with their ``step``,
``memory`` records, and each probing step's ``lab_step`` record with its ``probe`` facts) and
the ``LabConfig``, and draws its plots from those records into ``plots_dir`` (none when None).
``render_all(records, cfg)`` renders a stored run again::

    from attnlab.lab.render import render_all
    from attnlab.core.store import read_records
    sections = render_all(read_records("attnlab-out/results.jsonl"), cfg)
"""
from __future__ import annotations

import os

from .step_types import LabConfig, Section
from .steps import STEPS

#: {step id: render(records, cfg, plots_dir) -> Section}, in the lab's order.
RENDERERS = {sid: step.render for sid, step in STEPS.items()}


def render_all(records: list[dict], cfg: LabConfig, plots_dir: str | None = None,
               steps: list[str] | None = None) -> list[Section]:
    """Every step's section (or those of ``steps``) from a run's records; a stored step's status
    "failed" (its probe raised) is kept as it was recorded."""
    if plots_dir:
        os.makedirs(plots_dir, exist_ok=True)
    out = []
    for sid in steps or [s for s in RENDERERS if any(r.get("kind") == "lab_step" and r.get("step") == s for r in records)]:
        stored = next((r for r in reversed(records) if r.get("kind") == "lab_step" and r.get("step") == sid), None)
        if stored is not None and stored.get("status") == "failed" and "probe" not in stored:
            out.append(Section(sid, stored.get("title", sid), status="failed", reason=stored.get("reason")))
            continue
        out.append(RENDERERS[sid](records, cfg, plots_dir))
    return out
