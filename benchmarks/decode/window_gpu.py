"""Sliding-window decode on the GPU: attnlab-decode against the roofline of the window's bytes.

    PYTHONPATH=src python benchmarks/decode/window_gpu.py --out OUT [--quick] [--max-seconds 200] [--q-lens 4]
        [--windows 128] [--kernels triton,mosaic,mosaic64,triton:num_warps=2] [--direct]
    PYTHONPATH=src JAX_PLATFORMS=cpu python benchmarks/decode/window_gpu.py --out OUT --dry-run [--kernels ...]

Cells: ``decode_attention(..., local_window_size=(W, 0))`` (causal: each new token reads the W keys before
it and itself, W + T keys in all) with W in {128, 512, 1024, 4096}, cache length S in {8192, 32768, 131072}
with every cache full (the window at its end, the most the kernel can skip), T in {1, 4}, contiguous and
paged (16 tokens a page, vLLM's default), gpt-oss's heads (N, K, H) = (64, 8, 64), bf16; B = 256 (S <= 32768)
or 128 (S = 131072): the largest power of two whose cache fits 40 GB. Lengths are traced arguments of
``jax.jit`` (the plan cannot see them: it splits the window's span by its rule).

Each cell is checked against float64 before it is timed: batch elements 0 and B-1, on the window's keys
sliced out of the cache (the window's output depends on nothing else), by the decode tolerance policy
(``check_decode_close``). Then CUPTI (``jax.experimental.mosaic.gpu.profiler.measure``): the median over
iterations of the call's kernels summed (the split kernel and the combine), % of the roofline of the
window's K/V bytes (``attnlab_decode.roofline_ms(..., window=)``; ``pct_with_q_out`` also counts q read and
the output written) and the same call without a window (``full_ms``: what the window saves).
Goal (issue: windows in decode): <= 1.15x the roofline of the window's bytes, i.e. >= 87%.
``--kernels``: which decode kernels time each cell, one record each (``kernel``): "triton" (the default: what
``decode_attention`` runs for a window) and "mosaic" (``kernels.decode_mgpu``, wgmma + TMA, Hopper only: called
as ``decode_attention_pallas(..., config=DecodeConfig(kernel="mosaic"))``, the option a windowed call needs to
take it; its blocks start at the window's first block, not key), "mosaic64" (the same with 64-key steps, not
the plan's 128: less over-read at the window's start), "direct" and "combine": the Triton kernel called as
``decode_attention_pallas`` with its default config (a one-split plan stores O itself, one kernel:
``kernels.decode_direct``) and with ``DecodeConfig(direct_output=False)`` (float32 partials, then XLA's combine:
the path before); "triton:num_warps=2:block_k=64": the Triton kernel with those ``DecodeConfig`` parameters (a
tuning variant). ``--direct`` is ``--kernels direct,combine``; ``--windows 128``: only those W. Each record carries its plan's split count and
whether it stored directly (``num_splits``, ``direct``) and CUPTI's kernels of the call (``kernels``). A kernel
that cannot run a cell records why. Writes ``results.jsonl`` and ``README.md`` (a table) to --out. ``--dry-run``:
tiny sizes in Pallas interpret mode on the CPU: the cell list and the reference checks, nothing timed.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from benchmarks.results_folder import roofline_peaks  # noqa: E402 (after sys.path)

WINDOWS, LENGTHS, PAGE = (128, 512, 1024, 4096), (8192, 32768, 131072), 16
HEADS = (64, 8, 64)            # gpt-oss: N, K, H
CACHE_BYTES, GOAL_PCT = 40e9, 100 / 1.15


def batch_for(S: int, K: int, H: int, itemsize: int = 2, copies: int = 1) -> int:
    """The largest power of two <= 256 whose K and V caches of S tokens fit ``CACHE_BYTES``, ``copies`` times
    (a paged cell holds its pages beside the contiguous cache that the float64 check reads: 2)."""
    b = 256
    while b > 1 and copies * b * S * K * H * 2 * itemsize > CACHE_BYTES:
        b //= 2
    return b


def cells(quick: bool, dry_run: bool, q_lens=None, windows=None) -> list[dict]:
    """Every cell of the run, in order (grouped by cache: one cache per (S, layout))."""
    if dry_run:
        return [dict(S=256, W=w, T=t, layout=lay, B=2, N=8, K=1, H=64)   # H = 64: the Mosaic GPU kernel's least
                for lay in ("contig", f"paged{PAGE}") for w in (16, 64) for t in (1, 4)]
    N, K, H = HEADS
    out = []
    for S in sorted(LENGTHS, reverse=True):      # the longest caches first: the goal's hardest case
        for lay in ("contig", f"paged{PAGE}"):
            for T in (q_lens or ((1,) if quick else (1, 4))):
                for W in (windows or ((128, 1024) if quick else WINDOWS)):
                    out.append(dict(S=S, W=W, T=T, layout=lay, B=batch_for(S, K, H, copies=1 if lay == "contig" else 2),
                                    N=N, K=K, H=H))
    return out


def references(q, k, v, lengths, W: int):
    """(batch element, q_b, k_b, v_b, length in the slice) for elements 0 and B-1: the window's keys only."""
    T = int(q.shape[1])
    out = []
    for b in sorted({0, int(q.shape[0]) - 1}):
        n = int(lengths[b])
        lo = max(0, n - T - W)
        out.append((b, np.asarray(q[b:b + 1]), np.asarray(k[b:b + 1, lo:n]), np.asarray(v[b:b + 1, lo:n]), n - lo))
    return out


def check(out, refs, W: int) -> list[dict]:
    from attnlab.reference.decode64 import check_decode_close

    res = []
    for b, qb, kb, vb, n in refs:
        vd = check_decode_close(np.asarray(out[b:b + 1]), qb, kb, vb, [n], local_window_size=(W, 0))
        res.append(dict(b=b, rel_err=vd.rel_err, limit=vd.limit, ok=bool(vd.ok)))
    return res


def cupti_ms(fn, args, iterations: int = 10) -> tuple[float, list]:
    """(median ms of the call's kernels summed, [(kernel, median ms)]) by CUPTI."""
    from jax.experimental.mosaic.gpu import profiler

    _, per_iter = profiler.measure(fn, aggregate=False, iterations=iterations)(*args)
    names = [n for n, _ in per_iter[0]]
    kernels = [(n, float(np.median([it[i][1] for it in per_iter]))) for i, n in enumerate(names)]
    return float(np.median([sum(t for _, t in it) for it in per_iter])), kernels


KERNELS = ("triton", "mosaic", "mosaic64", "direct", "combine")


def config_of(kernel: str):
    """The ``DecodeConfig`` a Triton kernel name calls with: "combine" forces partials + combine, a tuning variant
    "triton:num_warps=2:block_k=64" sets those parameters; else None (the plan's)."""
    from attnlab.kernels import decode as kd

    if kernel.startswith("triton:"):
        return kd.DecodeConfig(**{k: int(v) for k, v in (p.split("=") for p in kernel.split(":")[1:])})
    return {"combine": kd.DecodeConfig(direct_output=False), "direct": kd.DecodeConfig(direct_output=True)}.get(kernel)


@functools.lru_cache(maxsize=None)
def call(window, paged: bool, interpret: bool, kernel: str = "triton"):
    """The jitted decode call of one window (None: the whole cache), contiguous or through a page table;
    ``kernel`` "mosaic": the Mosaic GPU kernel, on request (on the CPU in JAX's GPU interpreter)."""
    import jax

    import attnlab
    from attnlab.kernels import decode as kd

    if kernel in ("direct", "combine") or kernel.startswith("triton:"):    # the Triton kernel itself, configured
        def f(q, k, v, lengths, table=None):
            return kd.decode_attention_pallas(q, k, v, lengths, interpret=interpret, page_table=table, window=window,
                                              config=config_of(kernel))
    elif kernel == "mosaic":
        def f(q, k, v, lengths, table=None):
            return kd.decode_attention_pallas(q, k, v, lengths, interpret=interpret, page_table=table, window=window,
                                              config=kd.DecodeConfig(kernel="mosaic"))
    elif kernel == "mosaic64":   # its plan with 64-key steps: a window's first block over-reads up to 63 keys, not 127
        from attnlab.kernels import decode_mgpu as dm

        def f(q, k, v, lengths, table=None):
            (B, T, N, H), K = q.shape, k.shape[2]
            S = k.shape[1] if table is None else table.shape[1] * k.shape[1]
            plan = dm.make_mgpu_plan(B, T, S, N, K, H, block_kv=64, window=window)
            return dm.decode_attention_mgpu(q, k, v, lengths, plan=plan, window=window, page_table=table,
                                            interpret=interpret)
    elif interpret:      # the CPU: the kernel itself in interpret mode (decode_attention's would be the same)
        def f(q, k, v, lengths, table=None):
            return kd.decode_attention_pallas(q, k, v, lengths, interpret=True, page_table=table, window=window)
    else:
        def f(q, k, v, lengths, table=None):
            return attnlab.decode_attention(q, k, v, lengths, implementation="attnlab-decode", page_table=table,
                                            local_window_size=window)
    return jax.jit(f)


def caches(S, B, K, H, layout, seed=0):
    """k, v (B, S, K, H) bf16 drawn on the device, and (k_pages, v_pages, table) for a paged layout."""
    import jax
    import jax.numpy as jnp

    from attnlab.kernels.pages import to_pages

    kk, kv = jax.random.split(jax.random.PRNGKey(seed))
    k = jax.random.normal(kk, (B, S, K, H), jnp.bfloat16)
    v = jax.random.normal(kv, (B, S, K, H), jnp.bfloat16)
    return k, v, (to_pages(k, v, PAGE) if layout != "contig" else None)


_FULL_MS: dict = {}


def run_cell(c: dict, k, v, paged, dev: str, dry_run: bool, kernel: str = "triton") -> dict:
    import jax
    import jax.numpy as jnp

    from attnlab.backends.attnlab_decode import kv_bytes, roofline_ms

    peaks = roofline_peaks()
    B, S, T, W, N, K, H = (c[x] for x in ("B", "S", "T", "W", "N", "K", "H"))
    q = jax.random.normal(jax.random.PRNGKey(T + W), (B, T, N, H), jnp.bfloat16)
    lengths = jnp.full((B,), S, jnp.int32)
    rec = dict(c, kernel=kernel, device=dev, window=[W, 0], dtype="bfloat16", lengths_traced=True,
               window_kv_bytes=kv_bytes([S] * B, K, H, 2, q_len=T, window=(W, 0)),
               roofline_ms=roofline_ms([S] * B, T, N, K, H, 2, window=(W, 0), hbm_tbs=peaks["bandwidth"] / 1e12,
                                       peak_tflops=peaks["peak_flops"] / 1e12))
    args = (q, k, v, lengths) if paged is None else (q, paged[0], paged[1], lengths, paged[2])
    if kernel not in ("mosaic", "mosaic64"):   # the Triton kernel's plan for this call (lengths traced: the S_max rule)
        from attnlab.core import device
        from attnlab.kernels import decode as kd

        plan = kd.make_plan(B, T, S, N, K, H, jnp.bfloat16, config_of(kernel), window=(W, 0),
                            compute_capability=device.current().compute_capability)
        rec.update(num_splits=plan.num_splits, direct=plan.direct)
    fn = call((W, 0), paged is not None, dry_run, kernel)
    try:
        rec["check"] = check(fn(*args), references(q, k, v, [S] * B, W), W)
        if not all(x["ok"] for x in rec["check"]):
            rec["error"] = "check failed"
        elif not dry_run:
            rec["ms"], rec["kernels"] = cupti_ms(fn, args)
            rec["pct_roofline"] = 100 * rec["roofline_ms"] / rec["ms"]
            q_out = 2 * B * T * N * H * 2 / peaks["bandwidth"] * 1e3
            rec["pct_with_q_out"] = 100 * (rec["roofline_ms"] + q_out) / rec["ms"]
            full = (B, S, T, c["layout"], kernel)     # the whole-cache call, once per cache and T (not per W)
            if full not in _FULL_MS:
                _FULL_MS[full] = cupti_ms(call(None, paged is not None, False, kernel), args)[0]
            rec["full_ms"] = _FULL_MS[full]
    except Exception as e:  # noqa: BLE001 - one failed cell is recorded, the run goes on
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return rec


def table_md(recs) -> str:
    lines = ["| S | cache | B | T | W | kernel | splits | kernels | ms | % roofline (window K/V) | with q/out | "
             "goal >= 87% | whole cache ms | check |", "| --- " * 14 + "|"]
    for r in recs:
        worst = max((x["rel_err"] / x["limit"] for x in r.get("check", [])), default=float("nan"))
        chk = f"ok ({worst:.2f} of limit)" if "error" not in r else f"✗ {r['error'][:50]}"
        pct, pct_qo = r.get("pct_roofline"), r.get("pct_with_q_out")
        verdict = "–" if pct is None else "met" if pct >= GOAL_PCT else f"missed ({r['ms'] / r['roofline_ms']:.2f}x)"
        splits = "–" if "num_splits" not in r else f"{r['num_splits']}{' direct' if r['direct'] else ''}"
        cols = [r["S"], r["layout"], r["B"], r["T"], r["W"], r.get("kernel", "triton"), splits,
                len(r["kernels"]) if "kernels" in r else "–",
                f"{r['ms']:.4f}" if "ms" in r else "–",
                "–" if pct is None else f"{pct:.0f}%", "–" if pct_qo is None else f"{pct_qo:.0f}%", verdict,
                f"{r['full_ms']:.4f}" if "full_ms" in r else "–", chk]
        lines.append("| " + " | ".join(map(str, cols)) + " |")
    return "\n".join(lines) + "\n"


def direct_md(recs) -> str:
    """The one-split store against partials + combine, cell by cell (both timed): "" unless both kernels ran."""
    by = {(r["S"], r["layout"], r["T"], r["W"], r.get("kernel")): r for r in recs if "ms" in r}
    lines = []
    for (S, lay, T, W, kernel), r in by.items():
        old = by.get((S, lay, T, W, "combine"))
        if kernel == "direct" and old is not None:
            lines.append(f"| {S} | {lay} | {T} | {W} | {r['num_splits']} | {r['ms']:.4f} | {old['ms']:.4f} | "
                         f"{old['ms'] / r['ms']:.2f}x | {r['pct_roofline']:.0f}% |")
    head = ["", "One-split store (direct) against partials + combine:", "",
            "| S | cache | T | W | splits | direct ms | combine ms | speed-up | direct % roofline |",
            "| --- " * 9 + "|"]
    return "\n".join(head + lines) + "\n" if lines else ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="T=1, W in {128, 1024}")
    ap.add_argument("--q-lens", help="comma-separated T values instead (e.g. 4: --quick's windows at T=4)")
    ap.add_argument("--max-seconds", type=float, default=200.0, help="no new cell starts past this")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes, interpret mode: cells and checks only")
    ap.add_argument("--windows", help="comma-separated W values instead (e.g. 128)")
    ap.add_argument("--kernels", default="triton", help=f"comma-separated: {', '.join(KERNELS)} or a tuning variant "
                    "triton:PARAM=N[:PARAM=N] (DecodeConfig's; each cell on each)")
    ap.add_argument("--direct", action="store_true", help="--kernels direct,combine: one-split store vs the combine")
    a = ap.parse_args(argv)
    if a.direct:
        a.kernels = "direct,combine"
    kernels = a.kernels.split(",")
    if not kernels or {k for k in kernels if not k.startswith("triton:")} - set(KERNELS):
        ap.error(f"--kernels must list some of {', '.join(KERNELS)}, got {a.kernels!r}")
    import jax

    os.makedirs(a.out, exist_ok=True)
    t0 = time.perf_counter()
    dev = str(jax.devices()[0].device_kind)
    ints = lambda s: s and tuple(int(x) for x in s.split(","))  # noqa: E731
    todo = cells(a.quick, a.dry_run, ints(a.q_lens), ints(a.windows))
    recs, held = [], (None, None)
    with open(os.path.join(a.out, "results.jsonl"), "w") as f:
        for c, kernel in ((c, kernel) for c in todo for kernel in kernels):
            if time.perf_counter() - t0 > a.max_seconds:
                rec = dict(c, kernel=kernel, error=f"not run: past --max-seconds {a.max_seconds:g}")
            else:
                key = (c["S"], c["B"], c["layout"])
                if held[0] != key:
                    held = (None, None)                       # free the last cache before making the next
                    held = (key, caches(c["S"], c["B"], c["K"], c["H"], c["layout"]))
                rec = run_cell(c, *held[1], dev, a.dry_run, kernel)
            recs.append(rec)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            keys = ("S", "layout", "T", "W", "kernel", "num_splits", "direct", "ms", "pct_roofline", "error")
            print(json.dumps({k: rec.get(k) for k in keys}))
    md = table_md(recs) + direct_md(recs)
    with open(os.path.join(a.out, "README.md"), "w") as f:
        f.write(f"# Sliding-window decode on {dev}\n\n`PYTHONPATH=src python benchmarks/decode/window_gpu.py "
                f"--out {a.out}{' --dry-run' if a.dry_run else ''} --kernels {a.kernels}`\n\n" + md)
    print(md)
    print(json.dumps({"out": a.out, "cells": len(recs), "seconds": round(time.perf_counter() - t0, 1)}))
    return recs


if __name__ == "__main__":
    main()
