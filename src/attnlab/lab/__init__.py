"""``attnlab run``: the codelab as one command. Each step writes its record as it finishes."""
from __future__ import annotations

import os
import time
import traceback

from .. import device, env as envmod
from ..store import ResultStore
from .core import LabConfig, Section, Table
from .steps import STEPS


def config_for_machine(quick: bool = False) -> LabConfig:
    gpu = device.current().platform == "gpu"
    return LabConfig(quick=quick, gpu=gpu)


def run_lab(out_dir: str = "attnlab-out", *, label: str | None = None, quick: bool = False,
            sections: list[str] | None = None, progress=None) -> list[Section]:
    """Run the lab's steps in order; write results.jsonl, results.csv and report.html in out_dir."""
    from ..report import write_report

    unknown = [s for s in sections or [] if s not in STEPS]
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; choose from {list(STEPS)}")
    os.makedirs(out_dir, exist_ok=True)
    store_path = os.path.join(out_dir, "results.jsonl")
    if os.path.exists(store_path):
        os.remove(store_path)
    store = ResultStore(store_path)
    cfg = config_for_machine(quick)
    env = envmod.collect()
    done: list[Section] = []
    for sid, fn in STEPS.items():
        if sections and sid not in sections:
            continue
        if progress:
            progress(sid)
        t0 = time.perf_counter()
        try:
            sec = fn(cfg)
        except Exception as e:  # one failing step must not lose the others
            sec = Section(sid, sid, status="failed", reason=f"{type(e).__name__}: {e}")
            sec.paragraphs.append(traceback.format_exc(limit=3))
        sec.facts.setdefault("seconds", round(time.perf_counter() - t0, 3))
        rec = sec.record()
        rec["label"] = label
        rec["env"] = envmod.short(env)
        store.append(rec)
        done.append(sec)
    store.write_csv()
    write_report(os.path.join(out_dir, "report.html"), done, env, label=label)
    return done


__all__ = ["run_lab", "Section", "Table", "LabConfig", "STEPS"]
