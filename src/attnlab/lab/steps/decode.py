"""The decode step: T = 1-64 new tokens against a long KV cache, every path beside attnlab's kernel.

``sweeps_decode(cfg)`` declares the decode cells (``Cell.lengths = "full"``: ``decode_attention`` of
the T newest tokens, causal tail rule) as a ``Sweep`` the engine runs, each cell checked against the
float64/float32 references before it is timed; ``render_decode(records, config)`` turns those records
into the report's section (pure: no JAX, testable on canned records).
"""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ...core.records import time_ms  # noqa: E402
from ..step_types import LabConfig, Section, Step, Table, jax_side  # noqa: E402
from ..plots import log_ticks, save  # noqa: E402
from ..render_common import cells, fail_on_failed_cells  # noqa: E402
from . import decode_features, ragged_serving  # noqa: E402

TITLE = "Decode: T new tokens against a long KV cache"

#: attnlab's kernel, timed at every T of ``decode_shape``; the peers at ``peer_q_lens`` only: T = 1 (their
#: dedicated decode path) and one T > 1 (their prefill kernel) show where they fall off; `attnlab bench`
#: races every path at every T.
KERNEL = "attnlab-decode"
GPU_PEERS = ["cudnn", "torch-flash", "xla"]
CPU_PEERS = ["xla"]


#: A second group size, odd (Qwen2.5-7B's 28 query heads over 4 KV heads: G = 7), and the paged layouts
#: (vLLM's page table; page size 16 and 64 tokens) of the main shape, timed on attnlab's kernel only.
ODD_GROUP = (28, 4)
PAGED = ["paged16", "paged64"]


def decode_shape(cfg: LabConfig) -> dict:
    """(B, S, N, K, H, dtype, T values) the step runs at: the issue's shape on a GPU, small on a CPU.
    ``group_q_lens``: T of the G = 7 cells; ``paged_q_lens``/``paged``: T and layouts of the paged cells;
    ``feature_q_lens``/``window``: T of the window, sinks and FP8-cache cells and the window (``decode_features``)."""
    if cfg.gpu:
        return dict(batch=8, kv_len=4096 if cfg.quick else 32768, heads=32, kv_heads=8, head_dim=128, dtype="bfloat16",
                    q_lens=[1, 16] if cfg.quick else [1, 16, 64], peer_q_lens=[1] if cfg.quick else [1, 16],
                    group_q_lens=[] if cfg.quick else [1, 16], paged_q_lens=[1], paged=PAGED[:1] if cfg.quick else PAGED,
                    feature_q_lens=[] if cfg.quick else [1], window=128)
    return dict(batch=2, kv_len=256 if cfg.quick else 512, heads=8, kv_heads=2, head_dim=32, dtype="float32",
                q_lens=[4] if cfg.quick else [1, 16], peer_q_lens=[4] if cfg.quick else [1, 16],
                group_q_lens=[] if cfg.quick else [1], paged_q_lens=[4] if cfg.quick else [1], paged=PAGED[:1],
                feature_q_lens=[] if cfg.quick else [1], window=64)


def _time(r):
    return time_ms(r)


def render_decode(records: list[dict], cfg: LabConfig, plots_dir: str | None = None) -> Section:
    """The decode section from decode cell records (any order; non-ok cells shown with their status)."""
    s = Section("decode", TITLE)
    shp = decode_shape(cfg)
    every = [r for r in records if r.get("lengths") and not ragged_serving.is_serving(r)]
    serving = ragged_serving.table(records, shp)
    features = decode_features.table(every, shp)
    plain = [r for r in every if not decode_features.is_feature(r)]
    if not every:
        s.status, s.reason = "skipped", "no decode records"
        return s
    recs = [r for r in plain if _is_main(r, shp)]
    bes = list(dict.fromkeys(r["backend"] for r in recs))
    ts = sorted({r["q_len"] for r in recs})
    cupti = any(r.get("timer") == "cupti" for r in recs if r["status"] == "ok")
    unit = "CUPTI kernel ms" if cupti else "wall ms (no GPU: host clock)"
    rows = []
    for T in ts:
        row = [T]
        for b in bes:
            row.append(_cell_text(next((r for r in recs if r["q_len"] == T and r["backend"] == b), None), gbps=True))
        roof_ms = next((r.get("roofline_ms") for r in recs if r["q_len"] == T and r.get("roofline_ms")), None)
        row.append("–" if roof_ms is None else f"{roof_ms:.4g} ms")
        rows.append(row)
    s.tables.append(Table(f"decode_attention, B={shp['batch']} S={shp['kv_len']} N={shp['heads']}/K={shp['kv_heads']} "
                          f"H={shp['head_dim']} {shp['dtype']}, causal ({unit}; GB/s = bytes moved (valid K/V, q, output) / time)",
                          ["T"] + bes + ["roofline bound"], rows))
    gpu = cupti or cfg.gpu
    s.paragraphs.append(GPU_STORY if gpu else cpu_story(bes))
    ratios = []
    for b in bes:
        ok = sorted((r for r in recs if r["backend"] == b and r["status"] == "ok"), key=lambda r: r["q_len"])
        if len(ok) > 1:
            ratios.append(f"{b} {_time(ok[-1]) / _time(ok[0]):.2f}× (T={ok[-1]['q_len']} / T={ok[0]['q_len']})")
    if ratios:
        s.paragraphs.append(f"Measured here, time at the largest T over time at the smallest (same cache bytes): "
                            f"{', '.join(ratios)}." + (" " + GPU_FALL_OFF if gpu else ""))
    layouts = layout_table(plain, shp)
    if layouts:
        s.tables.append(layouts)
        s.paragraphs.append(GPU_LAYOUTS if gpu else
                            "By group size and cache layout (attnlab-decode alone, in interpret mode here): the paged "
                            "rows gather each block of keys through a vLLM-style page table; the last column is their "
                            "time over the contiguous cache of the same shape, on this CPU.")
    if features:
        s.tables.append(features)
        s.paragraphs.append(decode_features.STORY)
    if serving:
        s.tables.append(serving)
        s.paragraphs.append(ragged_serving.STORY)
    s.paragraphs.append(cells_note(cfg))
    if not gpu:
        s.paragraphs.append("Times are host wall clock of blocked calls; run on an NVIDIA GPU for the real race "
                            "(what the kernels do there: docs/decode.md).")
    if plots_dir:
        made = latency_plot(recs, os.path.join(plots_dir, "decode_latency_vs_T.png"), unit=unit)
        if made:
            s.plots.append(made)
    best = {}
    for T in ts:
        ok = [r for r in recs if r["q_len"] == T and r["status"] == "ok"]
        if ok:
            best[str(T)] = min(ok, key=_time)["backend"]
    steps = [r for r in records if ragged_serving.is_serving(r)]
    s.facts = {"fastest_by_T": best, "cells": len(every) + len(steps),
               "ok": sum(r["status"] == "ok" for r in every + steps)}
    fail_on_failed_cells(s, every + steps)
    return s


GPU_STORY = (
    "Decode is memory-bound: the arithmetic intensity is about T·N/K FLOP per byte of cache, far below a "
    "GPU's ridge (about 206 FLOP/B on the H200), so the bound is the time to read the K and V caches once, "
    "nearly the same for every T ≤ 64. attnlab's kernel (attnlab-decode) packs the T·(N/K) query rows that "
    "share a KV head into one tile, so every cache byte is read once, and splits the sequence across "
    "programs (flash-decoding) so that even B·K = 64 heads fill the GPU.")
GPU_FALL_OFF = (
    "The peers fall off at T > 1 because their T = 1 path is a dedicated split-KV decode kernel while "
    "T > 1 runs their prefill kernel: query tiles of 64-128 rows per head hold only T real rows, the "
    "grouped heads are not packed into a tile (the cache is read once per query head group instead of "
    "once), the sequence is not split so few programs run, and the causal tail of decode "
    "(query t at position L−T+t) is not jax.nn's top-left rule, so it arrives as a dense mask.")
GPU_LAYOUTS = (
    "By group size and cache layout (attnlab-decode alone): an odd group (G = 7) packs its T·7 rows per KV "
    "head into a tile padded in registers only, so it reads its (smaller: 4 KV heads) cache at the same "
    "bandwidth as G = 4; a paged cache (pages of 16 or 64 tokens in any order, found through a vLLM-style "
    "page table) gathers each block of keys through the table, and the last column says what that costs "
    "against the contiguous cache of the same shape.")
#: What each path is on a CPU (no GPU kernel runs there).
CPU_PATHS = {
    KERNEL: "attnlab-decode ran its Pallas kernel in interpret mode (the kernel's program executed op by op "
            "by XLA on the CPU: correct, not fast)",
    "xla": "xla ran jax.nn's XLA attention compiled for the CPU (the cache's valid lengths as key_value_seq_lengths, "
           "and for T > 1 the causal tail as a dense mask)",
    "naive": "naive ran attention written out in jax.numpy, compiled for the CPU",
}


def cpu_story(backends) -> str:
    """What ran on a CPU, path by path: no GPU kernel ran, so the GPU's reasons explain nothing here."""
    ran = [CPU_PATHS.get(b, f"{b} ran on the CPU") for b in backends]
    return ("On this CPU no GPU kernel ran: " + "; ".join(ran) + ". The times compare these CPU programs; "
            "the memory-bound story of decode (read the K and V caches once) is a GPU's.")


def _cell_text(r: dict | None, gbps: bool = False) -> str:
    """A table cell: "" (not measured), the status and why, or the time (GB/s) and % of the roofline."""
    if r is None:
        return ""
    if r["status"] != "ok":
        return f"{r['status']}: {(r.get('reason') or '')[:60]}"
    roof = f" · {r['pct_roofline']:.0f}% roof" if r.get("pct_roofline") is not None else ""
    return f"{_time(r):.4g} ms" + (f" · {r['gbps']:.4g} GB/s" if gbps else "") + roof


def _heads(r: dict, shp: dict) -> tuple[int, int]:
    """(N, K) of a record (records without them are the step's shape)."""
    return r.get("heads", shp["heads"]), r.get("kv_heads", shp["kv_heads"])


def _is_main(r: dict, shp: dict) -> bool:
    """A cell of the main race: the step's shape, contiguous cache (not a group-size or paged cell)."""
    return r.get("lengths") == "full" and _heads(r, shp) == (shp["heads"], shp["kv_heads"])


def _layout(r: dict) -> str:
    return "contiguous" if r.get("lengths") == "full" else f"paged {r.get('page_size')}"


def layout_table(records: list[dict], shp: dict) -> Table | None:
    """attnlab-decode by group size (G = N/K) and cache layout: one row each, one column per T, and for a
    paged row its time over the contiguous cell of the same G and T (None: no group-size or paged cell)."""
    kern = [r for r in records if r["backend"] == KERNEL]
    if not any(not _is_main(r, shp) for r in kern):
        return None
    ts = sorted({r["q_len"] for r in kern if not _is_main(r, shp)})
    keys = list(dict.fromkeys((*_heads(r, shp), _layout(r)) for r in kern if r["q_len"] in ts))
    contiguous = {(*_heads(r, shp), r["q_len"]): r for r in kern if r["lengths"] == "full" and r["status"] == "ok"}
    rows = []
    for N, K, layout in keys:
        row, ratios = [f"G = {N // K} ({N}/{K})", layout], []
        for T in ts:
            r = next((r for r in kern if (*_heads(r, shp), _layout(r), r["q_len"]) == (N, K, layout, T)), None)
            row.append(_cell_text(r))
            twin = contiguous.get((N, K, T))
            if r is not None and r["status"] == "ok" and layout != "contiguous" and twin:
                ratios.append(f"{_time(r) / _time(twin):.3f}× (T={T})")
        row.append(", ".join(ratios) or "–")
        rows.append(row)
    return Table(f"attnlab-decode by group size and cache layout, B={shp['batch']} S={shp['kv_len']} "
                 f"H={shp['head_dim']} {shp['dtype']}", ["group", "KV cache"] + [f"T={T}" for T in ts] +
                 ["paged / contiguous"], rows)


def latency_plot(records, path: str, *, unit: str) -> str | None:
    ok = [r for r in records if r["status"] == "ok" and _time(r)]
    if not ok:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    markers = "osD^v<>p*h"
    for i, b in enumerate(dict.fromkeys(r["backend"] for r in ok)):
        rs = sorted((r for r in ok if r["backend"] == b), key=lambda r: r["q_len"])
        ax.plot([r["q_len"] for r in rs], [_time(r) for r in rs], marker=markers[i % len(markers)], label=b)
    roof = sorted({(r["q_len"], r["roofline_ms"]) for r in ok if r.get("roofline_ms")})
    if roof:
        ax.plot([t for t, _ in roof], [m for _, m in roof], color="grey", linestyle="--", label="roofline bound")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    log_ticks(ax, "y")
    ax.set_xlabel("new tokens T")
    ax.set_ylabel("ms")
    ax.set_title(f"decode latency against T ({unit})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path)


def cells_note(cfg: LabConfig) -> str:
    shp = decode_shape(cfg)
    ts = lambda xs: ", ".join(map(str, xs))  # noqa: E731
    group = (f"; {KERNEL} at G = {ODD_GROUP[0] // ODD_GROUP[1]} ({ODD_GROUP[0]}/{ODD_GROUP[1]}) and T = "
             f"{ts(shp['group_q_lens'])} (an odd group size beside G = {shp['heads'] // shp['kv_heads']})"
             if shp["group_q_lens"] else "")
    paged = (f"; {KERNEL} with a paged cache ({', '.join(p.replace('paged', 'page size ') for p in shp['paged'])}) "
             f"at T = {ts(shp['paged_q_lens'])}, against its contiguous cell")
    features = (f"; {KERNEL} at T = {ts(shp['feature_q_lens'])} with a sliding window of {shp['window']}, with "
                f"sinks and on an FP8 cache, beside its plain cell" if shp["feature_q_lens"] else "")
    why = ("(their decode path and their prefill kernel): enough to see who stays flat in T" if cfg.gpu else
           "(the same T as attnlab's kernel)")
    return (f"Cells: {KERNEL} at T = {ts(shp['q_lens'])}; {', '.join(peers(cfg))} at T = {ts(shp['peer_q_lens'])} "
            f"{why}{group}{paged}{features}; its serving kernel at T = 1 on a {' and a '.join(ragged_serving.DISTS)} batch.")


def sweeps_decode(cfg: LabConfig) -> list:
    """The decode cells (``lengths="full"``: ``decode_attention`` of the T newest tokens, causal tail rule)."""
    Sweep = jax_side().Sweep
    shp = decode_shape(cfg)
    main = (shp["heads"], shp["kv_heads"])
    plan = [([KERNEL], shp["q_lens"], main, ["full"]), (peers(cfg), shp["peer_q_lens"], main, ["full"]),
            ([KERNEL], shp["group_q_lens"], ODD_GROUP, ["full"]), ([KERNEL], shp["paged_q_lens"], main, shp["paged"])]
    return [Sweep(backends, batch=[shp["batch"]], q_len=q_lens, kv_len=[shp["kv_len"]], heads=[N], kv_heads=[K],
                  head_dim=[shp["head_dim"]], dtype=[shp["dtype"]], causal=[True], lengths=lengths, name="decode")
            for backends, q_lens, (N, K), lengths in plan if q_lens] + decode_features.sweeps(shp) + [
        ragged_serving.sweep(shp)]


def peers(cfg: LabConfig) -> list[str]:
    """The paths raced against attnlab's kernel (quick on a GPU: cuDNN's alone, a smoke test)."""
    if cfg.gpu:
        return GPU_PEERS[:1] if cfg.quick else GPU_PEERS
    return CPU_PEERS


def render(records, cfg: LabConfig, plots_dir=None) -> Section:
    """The step's section from a run's records (its cell records tagged "decode")."""
    return render_decode(cells(records, "decode"), cfg, plots_dir)


STEP = Step("decode", TITLE, render, sweeps=sweeps_decode, cells_note=cells_note)
