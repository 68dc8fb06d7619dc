"""The serving grid's verdicts and tables (``grid_gpu.py --table`` rewrites README.md from results.jsonl).

A record (one JSON line per cell, ``grid_gpu.run_cell``) holds the cell's fields (``grid_cells.Cell.fields``),
``status`` (ok / error / skipped with ``reason``), attnlab's ``ms`` and ``pct_roofline`` of the valid work,
``tokens_per_s`` and ``peers`` ({path: {ms, pct_roofline} or {error}}, ``peers_absent``: {path: why}).
Goals (issue: a serving step at the roofline): decode >= 85% of the roofline at H = 64/128, >= 75% at H = 256;
mixed >= 75% of max(sum FLOPs / peak, sum bytes / bandwidth); never slower than the best peer (within
``TIE`` counts as a tie: CUPTI medians of the same call move by about that much).
"""
from __future__ import annotations

import json
import os

import numpy as np

from benchmarks.serving.grid_cells import cells, read_records

TIE = 0.02
PEAK_TFLOPS = 989
COLUMNS = ("sample", "batch", "B", "S", "H", "G", "T", "cache", "ms", "% roofline", "tokens/s", "goal",
           "best peer", "peer %", "vs best peer")


def goal_pct(r) -> int:
    """The cell's goal in % of the roofline: mixed 75, decode 85 (75 at H = 256)."""
    return 75 if r.get("mixed") or r["H"] >= 256 else 85


TODAY = "attnlab-decode (padded)"    # decode_attention's kernel on a uniform batch: "no slower than today"


def best_peer(r) -> tuple[str, dict] | None:
    """(path, result) of the fastest peer that passed its check (attnlab's own paths are not peers), or None."""
    ok = [(n, p) for n, p in (r.get("peers") or {}).items() if p.get("ms") and not n.startswith("attnlab")]
    return min(ok, key=lambda x: x[1]["ms"]) if ok else None


def _versus(ms, other_ms) -> str:
    ratio = other_ms / ms
    return "tie" if abs(ratio - 1) <= TIE else f"faster {ratio:.2f}x" if ratio > 1 else f"slower by {100 * (1 / ratio - 1):.0f}%"


def verdicts(r) -> dict:
    """goal ("met" / "missed by N" points / "–"), vs_peer ("faster 1.20x" / "tie" / "slower by N%" / "no peer"),
    and on uniform batches vs_today (against ``decode_attention``'s kernel on the same batch)."""
    pct, goal = r.get("pct_roofline"), goal_pct(r)
    out = dict(goal_pct=goal, goal="–" if pct is None else ("met" if pct >= goal else f"missed by {goal - pct:.0f}"))
    bp = best_peer(r)
    if bp is not None:
        out.update(best_peer=bp[0], best_peer_ms=bp[1]["ms"], best_peer_pct=bp[1].get("pct_roofline"))
    if bp is None or not r.get("ms"):
        out["vs_peer"] = "no peer" if r.get("ms") else "–"
    else:
        out["vs_peer"] = _versus(r["ms"], bp[1]["ms"])
    today = (r.get("peers") or {}).get(TODAY, {})
    if r.get("ms") and today.get("ms"):
        out["vs_today"] = _versus(r["ms"], today["ms"])
    return out


def latest(records) -> list[dict]:
    """One record per cell in the grid's order (cells not in the grid after it): the last ok record, else the last."""
    by = {}
    for r in records:
        cid = r.get("cell_id")
        if cid is None:
            continue
        if r.get("status") == "ok" or by.get(cid, {}).get("status") != "ok":
            by[cid] = r
    order = {c.cell_id: i for i, c in enumerate(cells())}
    return sorted(by.values(), key=lambda r: order.get(r["cell_id"], len(order)))


def _row(r) -> str:
    v = verdicts(r)
    bp = best_peer(r)
    if r.get("pct_roofline") is not None:
        ms, pct, tps = f"{r['ms']:.4f}", f"{r['pct_roofline']:.0f}%", f"{r['tokens_per_s']:.3g}"
    else:
        ms, pct, tps = f"{r.get('status', '?')}: {str(r.get('reason') or r.get('error', ''))[:60]}", "–", "–"
    goal = f"{v['goal_pct']}% {v['goal']}"
    peer = (bp[0], f"{bp[1]['pct_roofline']:.0f}%") if bp else ("–", "–")
    vs = v["vs_peer"] + (f"; today's decode kernel: {v['vs_today']}" if "vs_today" in v else "")
    cols = (r["sample"], r["batch"], r["B"], r["S"], r["H"], r["G"], r["T"], r["layout"], ms, pct, tps, goal, *peer, vs)
    return "| " + " | ".join(str(x) for x in cols) + " |"


def _range(xs) -> str:
    return "–" if not xs else f"{min(xs):.0f}%" if round(min(xs)) == round(max(xs)) else f"{min(xs):.0f}–{max(xs):.0f}%"


def summary_md(recs) -> list[str]:
    """Per batch kind: attnlab's % of the roofline, the goal met on how many cells, the best peer's %, and
    the cells faster than, tied with (within 1%) and slower than their best peer (the README's decode rows are
    restated from this)."""
    lines = ["| batch | cells | attnlab % of the roofline | goal met | best peer % | vs the best peer: faster / tied / slower |",
             "| --- | --- | --- | --- | --- | --- |"]
    kinds = sorted({r["batch"] for r in recs}, key=lambda b: (b.startswith("mixed"), b))
    for kind in kinds:
        rs = [r for r in recs if r["batch"] == kind and r.get("pct_roofline") is not None]
        if not rs:
            continue
        met = sum(verdicts(r)["goal"] == "met" for r in rs)
        peers = [best_peer(r)[1]["pct_roofline"] for r in rs if best_peer(r)]
        vs = [sum(verdicts(r)["vs_peer"].startswith(v) for r in rs) for v in ("faster", "tie", "slower")]
        today = sum(verdicts(r).get("vs_today", "").startswith("slower") for r in rs)
        lines.append(f"| {kind} | {len(rs)} | {_range([r['pct_roofline'] for r in rs])} | {met}/{len(rs)} | "
                     f"{_range(peers)} | {' / '.join(map(str, vs))}" + (f" (than today's decode kernel: {today})" if kind == "uniform" else "")
                     + " |")
    return lines


def table_md(records) -> str:
    """The README's body: the summary, the plan's cost, every cell, and what was skipped or failed."""
    recs = latest(records)
    ok = [r for r in recs if r.get("status") == "ok"]
    lines = [f"{len(recs)} of {len(cells())} cells recorded: {len(ok)} measured, "
             f"{sum(r.get('status') == 'skipped' for r in recs)} skipped, "
             f"{sum(r.get('status') == 'error' for r in recs)} failed.", ""]
    if any(str(r.get("timer", "")).startswith("wall") for r in recs):
        lines += ["**A dry run**: host wall clock in Pallas interpret mode on the CPU; its ms and % say nothing of a "
                  "GPU, only that every path ran and passed its float64 check.", ""]
    lines += summary_md(recs)
    plans = [r for r in ok if r.get("plan_ms") and r.get("ms")]
    if plans:
        share = [100 * r["plan_ms"] / (32 * r["ms"]) for r in plans]
        worst = plans[int(np.argmax(share))]
        lines += ["", f"Plan (inside jit, traced lengths): {min(r['plan_ms'] for r in plans):.4f}–"
                  f"{max(r['plan_ms'] for r in plans):.4f} ms, at most {max(share):.2f}% of a 32-layer step's "
                  f"attention ({worst['cell_id']}); goal <= 5%."]
    tf = [r["prefill_tflops"] for r in ok if r.get("prefill_tflops")]
    if tf:
        lines += ["", f"Prefill tiles of the mixed cells (their kernel alone): {min(tf):.0f}–{max(tf):.0f} TFLOP/s, "
                  f"{100 * min(tf) / PEAK_TFLOPS:.0f}–{100 * max(tf) / PEAK_TFLOPS:.0f}% of the {PEAK_TFLOPS} TFLOP/s "
                  "peak; goal for compute-bound tiles >= 70%."]
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += [_row(r) for r in recs]
    absent = sorted({f"{n}: {why}" for r in recs for n, why in (r.get("peers_absent") or {}).items()})
    if absent:
        lines += ["", "Peers left out, and why:", ""] + [f"- {a}" for a in absent]
    return "\n".join(lines) + "\n"


def write_table(out_dir, merge=()):
    """Rewrite OUT/results.jsonl (one record per cell, ``latest``), OUT/runs.txt (the calls that made them: each
    merged file's runs.txt beside it) and OUT/README.md from OUT's files and the ``merge`` files."""
    os.makedirs(out_dir, exist_ok=True)
    recs = latest(read_records([*merge, os.path.join(out_dir, "results.jsonl")]))
    with open(os.path.join(out_dir, "results.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    runs = []
    for p in [os.path.join(os.path.dirname(m), "runs.txt") for m in merge] + [os.path.join(out_dir, "runs.txt")]:
        if os.path.exists(p):
            runs += [x for x in open(p, encoding="utf-8").read().splitlines() if x.strip() and x not in runs]
    runs.sort()           # each line starts with its UTC date
    with open(os.path.join(out_dir, "runs.txt"), "w", encoding="utf-8") as f:
        f.writelines(x + "\n" for x in runs)
    dev = next((r["device"] for r in recs if r.get("device")), "?")
    header = "Calls (UTC date | versions | part | seconds | cells | command):\n\n" + "".join(f"- {x}\n" for x in runs)
    md = f"# serving_attention over the serving grid on {dev}\n\n{header}\n" + table_md(recs)
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write(md)
    return md
