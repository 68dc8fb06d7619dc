"""Issue 13's decode benchmark: attnlab's kernel beside every peer, through the sweep engine, one run.

    PYTHONPATH=src python3 benchmarks/decode/peers.py OUT_DIR [part ...]     # measure (resumable)
    python3 benchmarks/decode/peers.py --table OUT_DIR/results.jsonl          # markdown tables + goals

Every cell is a decode cell (``Cell.lengths``): ``decode_attention`` of the T newest tokens against an
S-long bf16 cache, causal (query t at position L[b] - T + t), checked on the whole output against
attnlab's blockwise float32 reference and float64 rows before it is timed (CUPTI kernel time, PyTorch's
too). Each record has ``gbps`` (valid KV bytes read / kernel time), ``pct_bandwidth`` (of 4.8 TB/s) and
``pct_roofline`` (roofline bound max(bytes / 4.8 TB/s, FLOPs / 989 TFLOP/s) / time).

Parts (a reduced grid of the issue's; the goal shape in full):
  goal    B=8, S=32768, N=32, K=8, H=128, T = 1, 2, 4, 8, 16, 32, 64: every peer
  long    B=1, S=131072, T = 1, 4, 16          short   B=32, S=4096, T = 1, 4, 16
  ragged  B=8, S=32768, ragged lengths, T = 1, 4, 16
  mqa     B=8, S=32768, N=8, K=1, T = 1, 4, 16  h64     B=8, S=32768, H=64, T = 1, 4, 16
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

PEERS = ["attnlab-decode", "cudnn", "torch-cudnn", "torch-flash", "tokamax-mosaic", "xla", "pallas-paged"]
FEW = ["attnlab-decode", "cudnn", "torch-cudnn", "torch-flash"]
T_ALL = [1, 2, 4, 8, 16, 32, 64]
T_FEW = [1, 4, 16]


def parts():
    from attnlab.sweep import Sweep

    common = dict(dtype=["bfloat16"], causal=[True], heads=[32], kv_heads=[8], head_dim=[128])
    return {
        "goal": Sweep(PEERS, batch=[8], q_len=T_ALL, kv_len=[32768], lengths=["full"], name="goal", **common),
        "long": Sweep(FEW, batch=[1], q_len=T_FEW, kv_len=[131072], lengths=["full"], name="long", **common),
        "short": Sweep(FEW, batch=[32], q_len=T_FEW, kv_len=[4096], lengths=["full"], name="short", **common),
        "ragged": Sweep(FEW + ["xla"], batch=[8], q_len=T_FEW, kv_len=[32768], lengths=["ragged"], name="ragged", **common),
        "mqa": Sweep(FEW, batch=[8], q_len=T_FEW, kv_len=[32768], lengths=["full"], name="mqa",
                     **{**common, "heads": [8], "kv_heads": [1]}),
        "h64": Sweep(FEW, batch=[8], q_len=T_FEW, kv_len=[32768], lengths=["full"], name="h64",
                     **{**common, "head_dim": [64]}),
    }


def measure(out: str, names: list[str]) -> None:
    from attnlab.measure import Options
    from attnlab.sweep import run_sweep

    opts = Options(repeats=20, compile_budget_s=120)
    all_parts = parts()
    for p in names or list(all_parts):
        def show(c, r, i, n, p=p):
            if r:
                print(f"[{p} {i + 1}/{n}] {c.backend:<15} {c.config_label:<52} {r['status']:<12} "
                      f"{r['kernel_ms'] or 0:8.4f} ms {r['gbps'] or 0:7.0f} GB/s roof {r.get('pct_roofline') or 0:5.1f}% "
                      f"m={r.get('margin') or 0:.2f} {(r['reason'] or '')[:70]}", flush=True)
        recs = run_sweep(all_parts[p], out, resume=True, options=opts, on_cell=show)
        print(json.dumps({"part": p, "cells": len(recs), "ok": sum(r["status"] == "ok" for r in recs)}), flush=True)


def table(path: str) -> str:
    """Markdown: per part, rows (shape, T) x backends: ms, TB/s and % of the roofline bound."""
    from attnlab.core.store import read_records

    recs = [r for r in read_records(path) if r.get("lengths")]
    lines = []
    for part in dict.fromkeys(r.get("sweep") for r in recs):
        rs = [r for r in recs if r.get("sweep") == part]
        names = [b for b in PEERS + ["xla"] if any(r["backend"] == b for r in rs)]
        names = list(dict.fromkeys(names))
        lines += [f"**{part}**: ms · TB/s · % of roofline (✗ = refused or failed, reason in the records)", "",
                  "| shape | T | " + " | ".join(names) + " |", "|" + " --- |" * (len(names) + 2)]
        keys = sorted({(r["batch"], r["kv_len"], r["heads"], r["kv_heads"], r["head_dim"], r["lengths"], r["q_len"])
                       for r in rs})
        for key in keys:
            by = {r["backend"]: r for r in rs if (r["batch"], r["kv_len"], r["heads"], r["kv_heads"], r["head_dim"],
                                                   r["lengths"], r["q_len"]) == key}
            cells = []
            for b in names:
                r = by.get(b)
                if r is None:
                    cells.append("")
                elif r["status"] != "ok":
                    cells.append("✗ " + r["status"])
                else:
                    mark = "" if r.get("timer") == "cupti" else "†"
                    ms = r["kernel_ms"] if r.get("kernel_ms") is not None else r["wall_ms"]
                    roof = f"{r['pct_roofline']:.0f}%" if r.get("pct_roofline") is not None else "–"
                    cells.append(f"{ms:.4f}{mark} · {r['gbps'] / 1e3:.2f} · {roof}")
            B, S, N, K, H, ln, T = key
            lines.append(f"| B{B} S{S} N{N}/{K} H{H} {ln} | {T} | " + " | ".join(cells) + " |")
        lines.append("")
    if any(r.get("timer") not in (None, "cupti") for r in recs if r["status"] == "ok"):
        lines += ["† not CUPTI kernel time (the record's `timer` names the clock)", ""]
    lines += goals(recs)
    return "\n".join(lines)


def goals(recs) -> list[str]:
    """Issue 13's goals on the goal shape, met or missed by how much."""
    g = {(r["backend"], r["q_len"]): r for r in recs if r.get("sweep") == "goal" and r["status"] == "ok"}
    out = ["**Goals (B=8, S=32768, GQA 32/8, H=128)**", ""]
    for T in T_ALL:
        own, cud = g.get(("attnlab-decode", T)), g.get(("cudnn", T))
        if own is None:
            out.append(f"- T={T}: attnlab-decode has no ok record")
            continue
        tbs = own["gbps"] / 1e3
        vs = f", {cud['kernel_ms'] / own['kernel_ms']:.2f}x cuDNN ({cud['kernel_ms']:.4f} ms)" if cud else ""
        if T == 1:
            ok = cud is not None and own["kernel_ms"] <= 1.05 * cud["kernel_ms"]
            rule = "within 5% of cuDNN or faster"
        elif T <= 16:
            ok = tbs >= 4.0 and (cud is None or cud["kernel_ms"] / own["kernel_ms"] >= 2.8)
            rule = ">= 4.0 TB/s and >= 2.8x cuDNN"
        else:
            ok = own["pct_roofline"] >= 70
            rule = ">= 70% of the roofline bound"
        out.append(f"- T={T}: {own['kernel_ms']:.4f} ms, {tbs:.2f} TB/s, {own['pct_roofline']:.0f}% of roofline{vs}: "
                   f"{'met' if ok else 'MISSED'} ({rule})")
    return out


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # the repository root
    from benchmarks.results_folder import script_args  # noqa: E402 (after sys.path)

    args = script_args(__doc__)
    if len(args) > 1 and args[0] == "--table":
        print(table(args[1]))
    else:
        measure(args[0], args[1:])
