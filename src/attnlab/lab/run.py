"""``run_lab``: each step's sweeps through the sweep engine, its probe, then its pure renderer."""
from __future__ import annotations

import os
import shutil
import time
import traceback

from .. import device, env as envmod
from ..store import ResultStore
from .core import LabConfig, LabContext, Section
from .decode import DECODE
from .perf import PERF
from .steps import BASICS

STEPS = {**BASICS, **PERF, **DECODE}


def config_for_machine(quick: bool = False) -> LabConfig:
    return LabConfig.for_machine(quick, device.current().platform == "gpu")


def run_step(step, ctx: LabContext) -> Section:
    """Measure the step's sweeps (engine), probe, render from the records; store its lab_step record."""
    t0 = time.perf_counter()
    probe = None
    try:
        for sweep in (step.sweeps(ctx.cfg) if step.sweeps else []):
            ctx.run_sweep(sweep)
        if step.probe:
            probe = step.probe(ctx)
            ctx.records.append({"kind": "lab_step", "step": step.id, "status": "running", "probe": probe})
        sec = step.render(ctx.records, ctx.cfg, ctx.plots_dir)
    except Exception as e:  # one failing step must not lose the others
        sec = Section(step.id, step.id, status="failed", reason=f"{type(e).__name__}: {e}")
        sec.paragraphs.append(traceback.format_exc(limit=4))
    if probe is not None:
        ctx.records.pop(next(i for i in range(len(ctx.records) - 1, -1, -1)
                             if ctx.records[i].get("step") == step.id and ctx.records[i].get("status") == "running"))
    sec.facts.setdefault("seconds", round(time.perf_counter() - t0, 3))
    rec = sec.record()
    if probe is not None:
        rec["probe"] = probe
    rec.update(label=ctx.label, env=ctx.env)
    ctx.append(rec)
    return sec


def run_lab(out_dir: str = "attnlab-out", *, label: str | None = None, quick: bool = False,
            sections: list[str] | None = None, progress=None, resume: bool = False,
            config: LabConfig | None = None) -> list[Section]:
    """Run the lab's steps in order; write results.jsonl, results.csv, plots/ and report.html in out_dir.

    Timed cells are measured by the sweep engine into ``out_dir/sweeps/`` as each finishes; with
    ``resume`` a run that was stopped (Ctrl-C, a kill) goes on: the cells recorded there are not
    measured again (probes run again: they are quick). ``config`` overrides the machine's sizes."""
    from ..report import write_report

    unknown = [s for s in sections or [] if s not in STEPS]
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; choose from {list(STEPS)}")
    os.makedirs(out_dir, exist_ok=True)
    store_path = os.path.join(out_dir, "results.jsonl")
    stale = [store_path, os.path.join(out_dir, "plots")] + ([] if resume else [os.path.join(out_dir, "sweeps")])
    for path in stale:
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    env_full = envmod.collect()
    ctx = LabContext(config or config_for_machine(quick), out_dir, ResultStore(store_path), envmod.short(env_full),
                     env_full=env_full, label=label, resume=resume)
    done: list[Section] = []
    chosen = [sid for sid in STEPS if not sections or sid in sections]
    for i, sid in enumerate(chosen):
        if progress:
            progress(sid, i, len(chosen))
        done.append(run_step(STEPS[sid], ctx))
    ctx.store.write_csv()
    write_report(os.path.join(out_dir, "report.html"), done, env_full, label=label)
    return done
