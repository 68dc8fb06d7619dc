"""``attnlab run``: the codelab as one command. Each step's records are written as they finish."""
from __future__ import annotations

import os
import shutil
import time
import traceback

from .. import device, env as envmod
from ..store import ResultStore
from .core import LabConfig, LabContext, Section, Table
from .decode import DECODE
from .perf import PERF
from .steps import BASICS

STEPS = {**BASICS, **PERF, **DECODE}


def config_for_machine(quick: bool = False) -> LabConfig:
    return LabConfig.for_machine(quick, device.current().platform == "gpu")


def run_lab(out_dir: str = "attnlab-out", *, label: str | None = None, quick: bool = False,
            sections: list[str] | None = None, progress=None) -> list[Section]:
    """Run the lab's steps in order; write results.jsonl, results.csv, plots/ and report.html in out_dir."""
    from ..report import write_report

    unknown = [s for s in sections or [] if s not in STEPS]
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; choose from {list(STEPS)}")
    os.makedirs(out_dir, exist_ok=True)
    store_path = os.path.join(out_dir, "results.jsonl")
    for stale in (store_path, os.path.join(out_dir, "plots")):
        if os.path.isdir(stale):
            shutil.rmtree(stale)
        elif os.path.exists(stale):
            os.remove(stale)
    env_full = envmod.collect()
    ctx = LabContext(config_for_machine(quick), out_dir, ResultStore(store_path), envmod.short(env_full),
                     env_full=env_full, label=label)
    done: list[Section] = []
    chosen = [sid for sid in STEPS if not sections or sid in sections]
    for i, sid in enumerate(chosen):
        if progress:
            progress(sid, i, len(chosen))
        t0 = time.perf_counter()
        try:
            sec = STEPS[sid](ctx)
        except Exception as e:  # one failing step must not lose the others
            sec = Section(sid, sid, status="failed", reason=f"{type(e).__name__}: {e}")
            sec.paragraphs.append(traceback.format_exc(limit=4))
        sec.facts.setdefault("seconds", round(time.perf_counter() - t0, 3))
        rec = sec.record()
        rec.update(label=label, env=ctx.env)
        ctx.store.append(rec)
        done.append(sec)
    ctx.store.write_csv()
    write_report(os.path.join(out_dir, "report.html"), done, env_full, label=label)
    return done


__all__ = ["run_lab", "Section", "Table", "LabConfig", "LabContext", "STEPS"]
