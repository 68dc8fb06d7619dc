"""``run_lab``: each step's sweeps through the sweep engine, its probe, then its pure renderer."""
from __future__ import annotations

import os
import shutil
import time
import traceback

from ..core import device
from ..core.record_model import CellRecord
from ..core.store import ResultStore, one_writer, read_jsonl
from ..measure import Options, env as envmod, prefetch
from ..report.html import write_report
from ..sweep import engine
from ..sweep.spec import Sweep
from .run_record import LabInterrupted, OutputHasResults, held_results, not_a_run, run_record
from .step_types import LabConfig, LabContext, Section
from .steps import STEPS


def config_for_machine(quick: bool = False) -> LabConfig:
    return LabConfig.for_machine(quick, device.current().platform == "gpu")


def lab_options(cfg: LabConfig) -> Options:
    """How the lab times its cells: more repeats on a GPU; on a CPU few, short and one input set."""
    if cfg.gpu:
        return Options(repeats=10 if cfg.quick else 30, compile_budget_s=240)
    return Options(repeats=2 if cfg.quick else 3, warmup=1, pipelined_calls=3, max_input_sets=1, compile_budget_s=120,
                   min_time_s=0.02 if cfg.quick else 0.05)


def run_sweep(ctx: LabContext, sweep: Sweep) -> list[CellRecord]:
    """Measure ``sweep``'s cells with the sweep engine, which skips every cell its folder holds
    already: one measured earlier in this run (the default shape appears in the timing step, both
    sweeps and the head-dim sweep) or, with ``ctx.resume``, by the run that was stopped. Each cell's
    record is stored in results.jsonl tagged ``step`` = the sweep's name; one measured by another
    sweep carries ``same_as`` naming it, so every table shows the same number for the same cell."""
    def counted(cell, rec, i, n):
        if rec is not None:
            ctx.measured[cell.key()] = rec
        elif cell.key() not in ctx.measured:
            ctx.resumed[cell.key()] = None
        if ctx.on_cell:
            ctx.on_cell(sweep.name, i + 1, n)

    out = []
    for rec in engine.run_sweep(sweep, ctx.sweeps_dir, resume=True, options=lab_options(ctx.cfg), on_cell=counted):
        same = {"same_as": rec["sweep"]} if rec.get("sweep") not in (None, sweep.name) else {}
        out.append(ctx.append(rec.with_fields(kind="cell", step=sweep.name, label=ctx.label, env=ctx.env, **same)))
    return out


def _prefetch(cfg: LabConfig, chosen: list[str]) -> None:
    """Every chosen step's cells are known before the first runs: their references compile in the
    background (``attnlab.measure.prefetch``). A step whose plan fails says so when it runs."""
    cells = []
    for sid in chosen:
        try:
            cells += [c for sw in (STEPS[sid].sweeps(cfg) if STEPS[sid].sweeps else []) for c in sw.cells()]
        except Exception:  # noqa: BLE001
            continue
    prefetch.start(cells, lab_options(cfg).check)


def run_step(step, ctx: LabContext) -> Section:
    """Measure the step's sweeps (engine), probe, render from the records; store its lab_step record."""
    t0 = time.perf_counter()
    probe = None
    try:
        for sweep in (step.sweeps(ctx.cfg) if step.sweeps else []):
            run_sweep(ctx, sweep)
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
            sections: list[str] | None = None, progress=None, resume: bool = False, overwrite: bool = False,
            config: LabConfig | None = None, on_step=None, on_cell=None) -> list[Section]:
    """Run the lab's steps in order; write results.jsonl, results.csv, plots/ and report.html in out_dir.

    Timed cells are measured by the sweep engine into ``out_dir/sweeps/`` as each finishes; with
    ``resume`` a run that was stopped (Ctrl-C, a kill) goes on: the cells recorded there are not
    measured again (probes run again: they are quick). A folder that holds results is refused
    (``OutputHasResults``) unless ``resume`` or ``overwrite`` is given. ``config`` overrides the
    machine's sizes. ``progress(step, i, n)`` is called before each step, ``on_step(section, i, n)``
    after it, ``on_cell(sweep, i, n)`` after each cell. The last record of results.jsonl is the run's
    ``kind: "run"`` record (``attnlab.lab.run_record.run_record``); Ctrl-C writes it too (status
    "interrupted") and raises ``LabInterrupted``, which says what finished."""
    if resume and overwrite:
        raise ValueError("resume and overwrite contradict each other: give one of them")
    unknown = [s for s in sections or [] if s not in STEPS]
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; choose from {list(STEPS)}")
    with one_writer(out_dir):
        return _run(out_dir, label, quick, sections, progress, resume, overwrite, config, on_step, on_cell)


def _run(out_dir, label, quick, sections, progress, resume, overwrite, config, on_step, on_cell) -> list[Section]:
    """``run_lab``'s work, in a folder this process holds."""
    store_path = os.path.join(out_dir, "results.jsonl")
    held = 0 if overwrite else held_results(out_dir)   # --overwrite erases what it cannot read too
    if held and not (resume or overwrite):
        raise OutputHasResults(out_dir, held)
    if resume and (why := not_a_run(out_dir)):
        raise ValueError(why)
    earlier_runs = [r for r in read_jsonl(store_path) if r.get("kind") == "run"] if resume else []
    stale = [store_path, os.path.join(out_dir, "plots")] + ([] if resume else [os.path.join(out_dir, "sweeps")])
    for path in stale:
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    t0 = time.perf_counter()
    env_full = envmod.collect()
    ctx = LabContext(config or config_for_machine(quick), out_dir, ResultStore(store_path), envmod.short(env_full),
                     env_full=env_full, label=label, resume=resume and bool(held), on_cell=on_cell)   # nothing held: a cold run
    for r in earlier_runs:   # a resumed run keeps the record of the run it goes on from
        ctx.store.append(r)
    done: list[Section] = []
    chosen = [sid for sid in STEPS if not sections or sid in sections]
    _prefetch(ctx.cfg, chosen)
    recorded = False
    try:
        for i, sid in enumerate(chosen):
            if progress:
                progress(sid, i, len(chosen))
            done.append(run_step(STEPS[sid], ctx))
            if on_step:
                on_step(done[-1], i, len(chosen))
        write_report(os.path.join(out_dir, "report.html"), done, env_full, label=label)
        ctx.store.append(run_record(ctx, done, chosen, time.perf_counter() - t0))   # last: the run is whole
        recorded = True
        ctx.store.write_csv()
    except KeyboardInterrupt:   # in a step, or after the last one (the report, the run's record: "report")
        stopped_in = chosen[len(done)] if len(done) < len(chosen) else "report"
        if not recorded:
            ctx.store.append(run_record(ctx, done, chosen, time.perf_counter() - t0, status="interrupted",
                                        stopped_in=stopped_in))
        ctx.store.write_csv()
        raise LabInterrupted(out_dir, [s.id for s in done], stopped_in, len(chosen), len(ctx.measured)) from None
    return done
