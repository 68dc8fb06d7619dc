"""How fast the measuring engine answers (issue 22): the peers sweep's cost, cell by cell, against the goals.

``peers_sweeps(quick)`` is the README's peers sweep (every backend side by side: forward bf16 and
fp16, training, decode, FP8; ~200 cells on a GPU), cut to the backends available here; ``quick`` is
a tiny grid any CPU runs in seconds. ``measure(out, quick, max_seconds)`` runs it into
``out/peers`` and returns the summary; ``lab_run(out, quick)`` times a cold ``attnlab run``.
``summary`` / ``markdown`` turn records into the goals' verdicts:

- per-cell overhead beyond its compile and its timing (``cell_s - compile_wait_s - timing_s``):
  median <= ``OVERHEAD_GOAL_S``;
- the first cell of each new shape (it pays the references), same overhead, T <= 16k: <= ``FIRST_GOAL_S``;
- the whole peers sweep in one 10-minute device call: wall <= ``SWEEP_GOAL_S``.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from attnlab import backends
from attnlab.measure import Options
from attnlab.measure.cell import IDENTITY, IDENTITY_DEFAULTS, record_key
from attnlab.core.records import cost_summary
from attnlab.sweep.engine import SweepInterrupted, run_sweep
from attnlab.sweep.spec import Sweep

OVERHEAD_GOAL_S, FIRST_GOAL_S, SWEEP_GOAL_S = 0.3, 2.0, 600.0


def _available(names: list[str]) -> list[str]:
    regs = set(backends.names())
    return [n for n in names if n in regs and backends.get(n).available() is None]


def peers_sweeps(quick: bool = False) -> list[Sweep]:
    """The peers sweep (``benchmarks/peers/sweep_gpu.py``'s parts), available backends only; ``quick``: a tiny CPU grid."""
    if quick:
        return [Sweep(_available(backends.peers("quick")), batch=[1], q_len=[64, 128], heads=[2], head_dim=[16],
                      dtype=["float32"], causal=[True], mode=["fwd", "fwd+bwd"], name="quick")]
    parts = [
        Sweep(backends.peers("fwd"), q_len=[1024, 4096, 16384], heads=[16], head_dim=[64, 128], dtype=["bfloat16"],
              causal=[False, True], tokens=16384, name="fwd"),
        Sweep(backends.peers("fwd16"), q_len=[1024, 4096, 16384], heads=[16], head_dim=[64, 128], dtype=["float16"],
              causal=[False, True], tokens=16384, name="fwd16"),
        Sweep(backends.peers("train"), q_len=[4096], heads=[16],
              head_dim=[128], dtype=["bfloat16"], causal=[False, True], mode=["fwd+bwd"], tokens=16384, name="train"),
        Sweep(backends.peers("decode"),
              batch=[8], q_len=[1], kv_len=[4096, 32768, 131072], heads=[32], kv_heads=[8], head_dim=[128],
              dtype=["bfloat16"], name="decode"),
        Sweep(backends.peers("fp8"), q_len=[4096, 16384], heads=[16], head_dim=[128],
              dtype=["bfloat16"], causal=[False, True], tokens=16384, name="fp8"),
    ]
    for s in parts:
        s.backends = _available(s.backends)
    return [s for s in parts if s.backends]


def measure(out: str, quick: bool = False, max_seconds: float = 480.0, options: Options | None = None) -> dict:
    """Run the peers sweep into ``out/peers`` (afresh), stopping after ``max_seconds``; its summary."""
    opts = options or (Options(repeats=10, compile_budget_s=120) if not quick else
                       Options(repeats=2, warmup=1, pipelined_calls=3, max_input_sets=2, min_time_s=0.0))
    folder = os.path.join(out, "peers")
    t0 = time.perf_counter()
    records, complete = [], True

    def deadline(cell, rec, i, n):
        if time.perf_counter() - t0 > max_seconds:
            raise KeyboardInterrupt

    for sweep in peers_sweeps(quick):
        try:
            records += run_sweep(sweep, folder, resume=True, options=opts, on_cell=deadline)
        except SweepInterrupted:
            complete = False
            from attnlab.core.store import read_records

            records = read_records(os.path.join(folder, "results.jsonl"))
            break
    # the sweeps share a folder: a cell of two sweeps (cuDNN's and TE's in the FP8 part) is measured and counted once
    records = list({record_key(r): r for r in records}.values())
    return summary(records, time.perf_counter() - t0, complete)


def _shape_key(r: dict) -> str:
    """A record's problem and inputs, without backend and mode: the cells that share references (``ref_key``)."""
    d = {k: r.get(k, IDENTITY_DEFAULTS.get(k)) for k in IDENTITY if k not in ("backend", "mode")}
    d["window"] = list(d["window"]) if d["window"] else None
    return json.dumps(d, sort_keys=True)


def _overhead(r: dict) -> float:
    """``cell_s - compile_wait_s - next_compile_wait_s - timing_s`` (the last wait is the next cell's
    compile, which the engine lets finish before this cell's timing); records from before issue 22 (no
    compile_wait_s, no timing_s) count ``compile_s`` as their compile wait and their timing as overhead."""
    wait = r["compile_wait_s"] if "compile_wait_s" in r else r.get("compile_s")
    wait = (wait or 0.0) + (r.get("next_compile_wait_s") or 0.0)
    return max(0.0, (r.get("cell_s") or 0.0) - wait - (r.get("timing_s") or 0.0))


def summary(records: list[dict], wall_s: float, complete: bool = True) -> dict:
    """Cells, per-phase seconds, overheads and the goals' verdicts (see module doc) of a sweep's records."""
    cells = [r for r in records if r.get("kind", "cell") == "cell"]
    seen, first = set(), []
    for r in cells:
        key = _shape_key(r)
        if key not in seen and r.get("status") in ("ok", "incorrect") and r.get("checked_fraction") is not None:
            seen.add(key)
            first.append(r)
    over = [_overhead(r) for r in cells if r.get("cell_s") is not None]
    first_16k = [_overhead(r) for r in first if r["q_len"] <= 16384]
    phases = {p: round(sum(r.get(f"{p}_s") or 0.0 for r in cells), 3)
              for p in ("inputs", "compile", "compile_wait", "check", "timing", "cell")}
    med = statistics.median(over) if over else None
    worst_first = max(first_16k) if first_16k else None
    goals = [_goal("median per-cell overhead beyond compile and timing", med, OVERHEAD_GOAL_S),
             _goal("first backend of a new shape (T <= 16k), overhead, worst", worst_first, FIRST_GOAL_S),
             _goal("peers sweep wall seconds (one 10-minute call)" + ("" if complete else ", INCOMPLETE"),
                   wall_s if complete else None, SWEEP_GOAL_S)]
    return {"cells": len(cells), "statuses": _counts(r["status"] for r in cells), "wall_s": round(wall_s, 2),
            "complete": complete, "cost_summary": cost_summary(cells), "phase_s": phases,
            "median_overhead_s": med, "first_of_shape": [{"backend": r["backend"], "label": _label(r),
                                                          "overhead_s": round(_overhead(r), 3),
                                                          "check_s": r.get("check_s"),
                                                          "parts": r.get("check_parts_s") or {}} for r in first],
            "goals": goals}


def _label(r: dict) -> str:
    from attnlab.core.records import config_label

    return config_label(r)


def _counts(xs) -> dict:
    out: dict = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return out


def _goal(name: str, measured: float | None, target: float) -> dict:
    if measured is None:
        return {"goal": name, "target_s": target, "measured_s": None, "met": None, "by_s": None}
    return {"goal": name, "target_s": target, "measured_s": round(measured, 3), "met": measured <= target,
            "by_s": round(target - measured, 3)}


def lab_goal_s(quick: bool) -> float:
    """Issue 22's goal for a cold lab run here: GPU 120 s (150 s with TransformerEngine), --quick 30 s;
    CPU 60 s, --quick 15 s."""
    from attnlab.core import device

    if device.current().platform != "gpu":
        return 15.0 if quick else 60.0
    te = "te" in backends.names() and backends.get("te").available() is None
    return 30.0 if quick else (150.0 if te else 120.0)


def lab_run(out: str, quick: bool = False, timeout_s: float = 480.0) -> dict:
    """A cold ``attnlab run`` (a subprocess) into ``out/lab``: its wall seconds and the run/step records it wrote."""
    folder = os.path.join(out, "lab")
    cmd = [sys.executable, "-m", "attnlab.cli", "run", "--out", folder] + (["--quick"] if quick else [])
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        rc, tail = None, f"killed after {timeout_s:g} s"
    wall = time.perf_counter() - t0
    recs = []
    try:
        with open(os.path.join(folder, "results.jsonl"), encoding="utf-8") as f:
            recs = [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        pass
    steps = {r.get("step"): r.get("seconds", r.get("wall_s")) for r in recs if r.get("kind") == "lab_step"}
    target = lab_goal_s(quick)
    goal = _goal(f"cold `attnlab run{' --quick' if quick else ''}` wall seconds", wall if rc == 0 else None, target)
    return {"command": " ".join(cmd), "rc": rc, "wall_s": round(wall, 2), "goal": goal, "run": next((r for r in recs if r.get("kind") == "run"), None),
            "step_s": steps, "cost_summary": cost_summary(recs), "tail": tail if rc else ""}


def markdown(result: dict) -> str:
    """The summary as Markdown: goals first (met / missed by how much), then where the time went."""
    p = result["peers"]
    lines = [f"# engine speed on {result.get('device', '?')}", "",
             f"peers sweep: {p['cells']} cells in {p['wall_s']} s wall ({'complete' if p['complete'] else 'INCOMPLETE'}); "
             f"statuses {p['statuses']}", "", f"`{p['cost_summary']}`", "",
             "| goal | target s | measured s | verdict |", "|---|---|---|---|"]
    for g in p["goals"] + ([result["lab"]["goal"]] if result.get("lab") else []):
        verdict = "–" if g["met"] is None else ("met" if g["met"] else f"missed by {-g['by_s']:.3g} s")
        lines.append(f"| {g['goal']} | {g['target_s']:g} | {g['measured_s'] if g['measured_s'] is not None else '–'} | {verdict} |")
    lines += ["", "phase seconds (sum over cells): " + ", ".join(f"{k} {v}" for k, v in p["phase_s"].items()), "",
              "| first cell of a shape | backend | overhead s | check s | of it: float32 reference s | float64 rows s |",
              "|---|---|---|---|---|---|"]
    rnd = lambda x: "–" if x is None else round(x, 3)  # noqa: E731
    lines += [f"| {f['label']} | {f['backend']} | {f['overhead_s']} | {rnd(f['check_s'])} | "
              f"{rnd(f.get('parts', {}).get('reference_s'))} | {rnd(f.get('parts', {}).get('float64_rows_s'))} |"
              for f in p["first_of_shape"]]
    if result.get("lab"):
        lab = result["lab"]
        lines += ["", f"`{lab['command']}`: rc {lab['rc']}, {lab['wall_s']} s wall; {lab['cost_summary']}",
                  "", "step seconds: " + json.dumps(lab["step_s"])]
    return "\n".join(lines) + "\n"
