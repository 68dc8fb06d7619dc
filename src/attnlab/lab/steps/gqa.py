"""The GQA step: MHA, GQA and MQA at the same FLOPs: the cells, XLA's compiled programs, and the section.

GQA does MHA's FLOPs, so a GQA time that differs from MHA's contradicts the step's first sentence
unless it is explained. The explanation is measured: the probe reads XLA's compiled program at
each variant (nothing is run): its matmuls (count and shape of the scores' dot) and the bytes its
layout copies move (XLA's ``copy`` ops: transposes it materialises). On a CPU these explain a GQA
time that differs from MHA's (the grouped einsum stacks G query heads into one larger matmul, with
copies to lay them out), where a GPU's fused kernel simply reads each key/value head once.
"""
from __future__ import annotations

import re

from ...report import shared_rows
from ..step_types import LabConfig, LabContext, Step, Table, jax_side
from ..plots import time_ms, timing
from ..render_common import ITEMSIZE, cells, fail_on_failed_cells, field_text, section_renderer, time_text

TITLE = "MHA, GQA and MQA"


def gqa_shape(cfg: LabConfig) -> dict:
    """The step's shape: T = S, query heads N, the (variant, K) pairs, masked or not. Quick: the
    default shape unmasked, so MHA is the timing step's cell."""
    N = 32 if cfg.gpu and not cfg.quick else cfg.heads
    return {"T": cfg.long_len, "N": N, "causal": not cfg.quick,
            "variants": [("MHA", N), ("GQA", N // 4 if N >= 8 else max(1, N // 2)), ("MQA", 1)]}


def gqa_cells(cfg: LabConfig) -> list[tuple[str, list[int]]]:
    """[(backend, [K, ...])]: on a GPU the fused kernel at every K (its time should not grow with
    N/K) and XLA at MHA and GQA (its broadcast of K/V shows); on a CPU, XLA at every K."""
    ks = [K for _, K in gqa_shape(cfg)["variants"]]
    if not cfg.gpu:
        return [("xla", ks)]
    if cfg.quick:
        return [("cudnn", [ks[0], ks[-1]])]
    return [("cudnn", ks), ("xla", ks[:2])]


def sweeps(cfg: LabConfig) -> list:
    Sweep = jax_side().Sweep
    c, g = cfg, gqa_shape(cfg)
    return [Sweep([b], batch=[c.batch], q_len=[g["T"]], heads=[g["N"]], kv_heads=ks, head_dim=[c.head_dim],
                  dtype=[c.perf_dtype], causal=[g["causal"]], name="gqa") for b, ks in gqa_cells(c)]


def cells_note(cfg: LabConfig) -> str:
    return ("Cells: " + "; ".join(f"{b} at K = {', '.join(map(str, ks))}" for b, ks in gqa_cells(cfg))
            + " — MHA against GQA/MQA at the same FLOPs.")


_OP = re.compile(r"= (\w+)\[([\d,]*)\]\{[^}]*\} (dot|copy)\(")
_ITEMSIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s32": 4, "pred": 1}


def program_facts(hlo_text: str) -> dict:
    """{dots: [[dtype, shape], ...], copy_bytes}: the compiled HLO's dot outputs and the bytes its copy ops write."""
    dots, copy_bytes = [], 0
    for dtype, dims, op in _OP.findall(hlo_text):
        shape = [int(d) for d in dims.split(",") if d]
        if op == "dot":
            dots.append([dtype, shape])
        else:
            n = _ITEMSIZE.get(dtype, 4)
            for d in shape:
                n *= d
            copy_bytes += n
    return {"dots": dots, "copy_bytes": copy_bytes}


def probe(ctx: LabContext) -> dict:
    """For XLA at each (variant, K) of the step: the compiled program's matmuls and copy bytes."""
    jx = jax_side()
    jax, api = jx.jax, jx.api
    c, g = ctx.cfg, gqa_shape(ctx.cfg)
    out = {}
    if c.quick:   # a smoke test: the compiles are left out
        return {"xla_programs": out}
    for name, K in g["variants"]:
        q = jax.ShapeDtypeStruct((c.batch, g["T"], g["N"], c.head_dim), c.perf_dtype)
        kv = jax.ShapeDtypeStruct((c.batch, g["T"], K, c.head_dim), c.perf_dtype)
        fn = jax.jit(lambda q, k, v: api.attention(q, k, v, implementation="xla", is_causal=g["causal"]))
        try:
            out[name] = {"K": K, **program_facts(fn.lower(q, kv, kv).compile().as_text())}
        except Exception as e:  # noqa: BLE001 - a fact that cannot be read is said, not fatal
            out[name] = {"K": K, "error": f"{type(e).__name__}: {e}"[:200]}
    return {"xla_programs": out}


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


def compare_to_mha(recs: list[dict], backend: str) -> dict[int, str]:
    """{K: "slower", "faster" or "same"} for each timed GQA/MQA variant of ``backend`` against its MHA
    cell, judged on the repeats' spread (a variant whose 25th percentile is above MHA's 75th is
    slower); empty without MHA or another timed variant."""
    ok = [r for r in recs if r["backend"] == backend and r["status"] == "ok" and time_ms(r)]
    mha = next((r for r in ok if r["kv_heads"] == r["heads"]), None)
    if mha is None:
        return {}
    m = timing(mha)
    return {r["kv_heads"]: "slower" if timing(r)["p25"] > m["p75"] else "faster" if timing(r)["p75"] < m["p25"] else "same"
            for r in ok if r is not mha}


def explanation(recs: list[dict], p: dict | None, backend: str = "xla") -> str | None:
    """The measured reason a GQA/MQA time differs from MHA's on ``backend`` (None when it does not)."""
    verdicts = compare_to_mha(recs, backend)
    differ = {K: v for K, v in verdicts.items() if v != "same"}
    if not differ:
        return None
    ok = {r["kv_heads"]: r for r in recs if r["backend"] == backend and r["status"] == "ok"}
    mha = next(r for r in ok.values() if r["kv_heads"] == r["heads"])
    times = ", ".join(f"K={K}: {time_ms(r):.3g} ms" for K, r in sorted(ok.items(), reverse=True))
    said = ", ".join(f"{v} at K={K}" for K, v in sorted(verdicts.items(), reverse=True))
    text = (f"Here {backend}'s GQA/MQA against its MHA (K={mha['kv_heads']}): {said} ({times}; faster or slower only "
            f"where the repeats' 25th–75th percentiles do not overlap), although every variant does the same FLOPs "
            f"(N = {mha['heads']} query heads).")
    progs = (p or {}).get("xla_programs") or {}
    if backend == "xla" and progs and all("dots" in v for v in progs.values()):
        shapes = "; ".join(f"{name} (K={v['K']}): {_matmuls(v)}, layout copies {v['copy_bytes'] / 1e6:.3g} MB"
                           for name, v in progs.items())
        text += (f" The compiled programs show why (measured from XLA's compiled HLO): {shapes}. XLA stacks the "
                 "G = N/K query heads that share a key/value head into one larger matmul, so the variants differ in "
                 "matmul shape and in the layout copies around them, not in work; a CPU's speed depends on both. "
                 "GQA's saving is bandwidth and cache memory (the table below): it shows where reading K and V "
                 "dominates, in decoding (the decode step) and in a GPU's fused kernels.")
    return text


@section_renderer("gqa", TITLE, needs=("gqa",))
def render(s, p, records, cfg: LabConfig, plots_dir=None) -> None:
    c = cfg
    dt = c.perf_dtype
    g = gqa_shape(c)
    T, N, causal = g["T"], g["N"], g["causal"]
    got = cells(records, "gqa")
    rows, recs = [], []
    for name, K in g["variants"]:
        for b, _ in gqa_cells(c):
            r = next((r for r in got if r["kv_heads"] == K and r["backend"] == b), None)
            if r is None:
                continue
            recs.append(r)
            rows.append([name, b, f"({c.batch}, {T}, {N}, {c.head_dim})", f"({c.batch}, {T}, {K}, {c.head_dim})",
                         field_text(r, "rel L2 vs float64"), time_text(r), f"{2 * K * c.head_dim * ITEMSIZE[dt]} B"])
    s.tables.append(Table(f"Query heads N={N}; key/value heads K ({'causal' if causal else 'no mask'}, T=S={T}, {dt})",
                          ["variant", "backend", "query shape", "key/value shape", "rel L2 vs float64", "time",
                           "KV cache / token / layer"], rows, sources=recs))
    s.tables.append(Table(shared_rows.KV_TITLE, shared_rows.KV_COLUMNS, shared_rows.kv_cache_rows()))
    s.paragraphs.append("GQA lets G = N/K query heads share one key/value head: same FLOPs as MHA, K/N of the "
                        "key/value memory and bandwidth. attnlab broadcasts key/value heads rather than copying them.")
    s.paragraphs.append(cells_note(c))
    for b in dict.fromkeys(r["backend"] for r in recs):
        why = explanation(recs, p, b)
        if why:
            s.paragraphs.append(why)
    s.facts = {"cells": [{k: r[k] for k in ("backend", "kv_heads", "status", "rel_err")} for r in recs]}
    fail_on_failed_cells(s, recs)


STEP = Step("gqa", TITLE, render, sweeps=sweeps, probe=probe, cells_note=cells_note)
