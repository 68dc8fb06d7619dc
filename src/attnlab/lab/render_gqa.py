"""Step 9's section (MHA, GQA and MQA) from records: pure, no JAX.

GQA does MHA's FLOPs, so a GQA time that differs from MHA's contradicts the step's first sentence
unless it is explained. The explanation is measured: the step's probe (``gqa_probe``) reads XLA's
compiled programs, whose matmul shapes and layout copies differ between the variants.
"""
from __future__ import annotations

from ..report import tables
from .core import LabConfig, Section, Table
from .plan import cells_note, gqa_cells, gqa_shape
from .render_common import ITEMSIZE, TITLES, cells, fmt, missing, probe, time_text
from .plots import time_ms, timing


def _matmuls(prog: dict) -> str:
    """"32 matmuls of 256×256": the compiled program's largest dot, as batch count and output shape."""
    if not prog.get("dots"):
        return "?"
    _, shape = max(prog["dots"], key=lambda d: _prod(d[1]))
    return f"{_prod(shape[:-2])} matmuls of {shape[-2]}×{shape[-1]}"


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def compare_to_mha(recs: list[dict], backend: str) -> str | None:
    """"slower", "faster" or "same" for the GQA variants of ``backend`` against its MHA cell, judged
    on the repeats' spread (a variant whose 25th percentile is above MHA's 75th is slower); None
    without MHA or another timed variant."""
    ok = [r for r in recs if r["backend"] == backend and r["status"] == "ok" and time_ms(r)]
    mha = next((r for r in ok if r["kv_heads"] == r["heads"]), None)
    others = [r for r in ok if r is not mha]
    if mha is None or not others:
        return None
    m = timing(mha)
    if any(timing(r)["p25"] > m["p75"] for r in others):
        return "slower"
    if any(timing(r)["p75"] < m["p25"] for r in others):
        return "faster"
    return "same"


def explanation(recs: list[dict], p: dict | None, backend: str = "xla") -> str | None:
    """The measured reason a GQA/MQA time differs from MHA's on ``backend`` (None when it does not)."""
    verdict = compare_to_mha(recs, backend)
    if verdict in (None, "same"):
        return None
    ok = {r["kv_heads"]: r for r in recs if r["backend"] == backend and r["status"] == "ok"}
    mha = next(r for r in ok.values() if r["kv_heads"] == r["heads"])
    times = ", ".join(f"K={K}: {time_ms(r):.3g} ms" for K, r in sorted(ok.items(), reverse=True))
    text = (f"Here {backend}'s GQA/MQA is {verdict} than its MHA ({times}), although every variant does the same "
            f"FLOPs (N = {mha['heads']} query heads).")
    progs = (p or {}).get("xla_programs") or {}
    if backend == "xla" and progs and all("dots" in v for v in progs.values()):
        shapes = "; ".join(f"{name} (K={v['K']}): {_matmuls(v)}, layout copies {v['copy_bytes'] / 1e6:.3g} MB"
                           for name, v in progs.items())
        text += (f" The compiled programs show why (measured from XLA's compiled HLO): {shapes}. XLA stacks the "
                 "G = N/K query heads that share a key/value head into one larger matmul, so the variants differ in "
                 "matmul shape and in the layout copies around them, not in work; a CPU's speed depends on both. "
                 "GQA's saving is bandwidth and cache memory (the table below): it shows where reading K and V "
                 "dominates, in decoding (step 12) and in a GPU's fused kernels.")
    return text


def render_gqa(records, cfg: LabConfig, plots_dir=None) -> Section:
    c = cfg
    dt = c.perf_dtype
    g = gqa_shape(c)
    T, N, causal = g["T"], g["N"], g["causal"]
    s = Section("gqa", TITLES["gqa"])
    got = cells(records, "gqa")
    if not got:
        return missing("gqa", s.title)
    rows, recs = [], []
    for name, K in g["variants"]:
        for b, _ in gqa_cells(c):
            r = next((r for r in got if r["kv_heads"] == K and r["backend"] == b), None)
            if r is None:
                continue
            recs.append(r)
            rows.append([name, b, f"({c.batch}, {T}, {N}, {c.head_dim})", f"({c.batch}, {T}, {K}, {c.head_dim})",
                         fmt(r["rel_err"], ".2e"), time_text(r), f"{2 * K * c.head_dim * ITEMSIZE[dt]} B"])
    s.tables.append(Table(f"Query heads N={N}; key/value heads K ({'causal' if causal else 'no mask'}, T=S={T}, {dt})",
                          ["variant", "backend", "query shape", "key/value shape", "rel L2 vs float64", "time",
                           "KV cache / token / layer"], rows))
    s.tables.append(Table(tables.KV_TITLE, tables.KV_COLUMNS, tables.kv_cache_rows()))
    s.paragraphs.append("GQA lets G = N/K query heads share one key/value head: same FLOPs as MHA, K/N of the "
                        "key/value memory and bandwidth. attnlab broadcasts key/value heads rather than copying them.")
    s.paragraphs.append(cells_note("gqa", c))
    for b in dict.fromkeys(r["backend"] for r in recs):
        why = explanation(recs, probe(records, "gqa"), b)
        if why:
            s.paragraphs.append(why)
    s.facts = {"cells": [{k: r[k] for k in ("backend", "kv_heads", "status", "rel_err")} for r in recs]}
    if any(r["status"] == "incorrect" for r in recs):
        s.status, s.reason = "failed", "a GQA/MQA path disagreed with the float64 reference"
    return s
