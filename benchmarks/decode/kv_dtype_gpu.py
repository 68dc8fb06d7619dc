"""Quantized KV caches on the GPU: attnlab-decode on FP8 / int8 caches against the bf16 cache, and what they cost.

    PYTHONPATH=src python benchmarks/decode/kv_dtype_gpu.py --out OUT [--quick] [--max-seconds 200]
    PYTHONPATH=src python benchmarks/decode/kv_dtype_gpu.py --out /tmp/kvq --dry-run     # tiny, any CPU

Cells: B=8, S=32768 (every sequence full), N/K = 32/8, H=128, q bf16, T in {1, 2, 4, 8}; caches bf16 and
fp8 (e4m3) with per-token scales, fp8 per-tensor, e5m2 and int8 per-token (``--quick``: bf16 and fp8 per
token, T in {1, 8}); contiguous and paged (pages of 16). Every cell is checked first: its first and last
sequence against float64 of the dequantized cache (``check_decode_close``, the decode tolerance policy);
a cell that fails is not timed. Then CUPTI kernel time (``jax.experimental.mosaic.gpu.profiler.measure``
through ``attnlab.measure.timers.kernel_per_call``: every kernel of the call summed), the roofline of the
cell's own bytes (``Workload.bytes``: K/V at the cache's dtype plus the scales; H200 4.8 TB/s) and the
speed-up over the bf16 cache of the same T and layout. Goals (issue 34): fp8 >= 1.8x bf16 at T <= 8, and
>= 85% of its roofline. Then the error report (``measure.kv_cells.kv_cache_errors``, B=2, S=4096, T=4, on
attnlab-decode): per input distribution, each cache's relative L2 error against float64 of the unquantized
values, next to bf16 K/V's. Then (not ``--quick``) tile variants of the kernel on the fp8 cache (``VARIANTS``:
longer key blocks, deeper pipelines; the plan sizes shared memory by q's dtype). ``--mma``: only the bf16 cells and
every quantized cache with its products in q's dtype and in float16 (``DecodeConfig.kv_mma``), T in {1, 8},
contiguous and paged 16; ``--pairs``: the FP8 caches in float16 products read as bytes and as int16 pairs
(``DecodeConfig.kv_pairs``). Writes ``results.jsonl`` and
``README.md`` (the tables) to --out.
``--dry-run``: the same cells at B=2, S=256, H=64 in Pallas interpret mode with the wall clock (checks that
every cell runs; the times mean nothing). Ran on the H200: results/gpu-2026-12-05-kv-dtype, -kv-probe, gpu-2026-12-05c-kv-products.
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
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))   # the repository root: benchmarks

from benchmarks.results_folder import ResultsFolder, roofline_peaks  # noqa: E402 (after sys.path)

FULL = dict(B=8, S=32768, N=32, K=8, H=128)
DRY = dict(B=2, S=256, N=8, K=2, H=64)
CACHES = (None, ("float8_e4m3fn", "token"), ("float8_e4m3fn", "tensor"), ("float8_e5m2", "token"), ("int8", "token"))
GOAL_SPEEDUP, GOAL_ROOFLINE = 1.8, 85.0


def cache_name(kv) -> str:
    return "bf16" if kv is None else f"{kv[0]}:{kv[1]}"


def make_cell(key, T, kv, page_size, shape, config=None):
    """(timed fn, its args, checker) of one cell; the caches quantized before timing (as a server holds them).
    ``config``: a ``DecodeConfig`` variant of the kernel (called directly), else decode_attention's default."""
    import jax
    import jax.numpy as jnp

    import attnlab
    from attnlab.kernels.pages import to_pages

    B, S, N, K, H = (shape[x] for x in "BSNKH")
    kq, kk, kv_ = jax.random.split(jax.random.fold_in(key, T), 3)
    q = jax.random.normal(kq, (B, T, N, H), jnp.bfloat16)
    k, v = (jax.random.normal(x, (B, S, K, H), jnp.bfloat16) for x in (kk, kv_))
    lens = jnp.full((B,), S, jnp.int32)
    table = None
    if page_size:
        k, v, table = to_pages(k, v, page_size)
        table = jnp.asarray(table)
    scales = (None, None)
    if kv is not None:
        (k, ks), (v, vs) = (attnlab.quantize_kv_cache(x, kv[0], kv[1]) for x in (k, v))
        scales = (ks, vs)

    @jax.jit
    def fn(q, k, v, lens, table, ks, vs):
        if config is not None:
            from attnlab.kernels.decode import decode_attention_pallas

            return decode_attention_pallas(q, k, v, lens, causal=True, config=config, page_table=table, k_scale=ks,
                                           v_scale=vs, kv_scale=None if kv is None else kv[1])
        return attnlab.decode_attention(q, k, v, lens, implementation="attnlab-decode", page_table=table,
                                        k_scale=ks, v_scale=vs)

    args = (q, k, v, lens, table, *scales)
    return fn, args, functools.partial(check_cell, args=args, kv=kv, page_size=page_size)


def check_cell(out, *, args, kv, page_size) -> dict:
    """The first and last sequence against float64 of their (dequantized) cache rows."""
    from attnlab.core.kv_quant import dequantize
    from attnlab.reference.decode64 import check_decode_close

    q, k, v, lens, table, ks, vs = args
    bi = np.array(sorted({0, int(q.shape[0]) - 1}))
    rows = bi if table is None else np.asarray(table)[bi].ravel()      # the sequences' rows, or their pages

    def host(c, s):
        x = np.asarray(c)[rows]
        if kv is not None:
            s = np.asarray(s)
            x = dequantize(x, s[rows] if kv[1] in ("token", "page") else s, kv[1], "float64")
        return np.asarray(x, np.float64).reshape(len(bi), -1, *x.shape[2:])

    verdict = check_decode_close(np.asarray(out)[bi], np.asarray(q)[bi], host(k, ks), host(v, vs), np.asarray(lens)[bi])
    return {"ok": verdict.ok, "rel_err": verdict.rel_err, "limit": verdict.limit}


def time_ms(fn, args, dry: bool) -> float:
    if dry:
        import jax

        jax.block_until_ready(fn(*args))
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        return (time.perf_counter() - t) * 1e3
    from attnlab.measure import timers

    return timers.kernel_per_call(fn, [args], 20).median


def roofline_ms(T, kv, page_size, shape) -> tuple[float, float]:
    """(bytes, roofline ms) of a cell: its own bytes (the cache's dtype, the scales) at the device's bandwidth, or its FLOPs."""
    from attnlab.core.workload import Workload

    B, S, N, K, H = (shape[x] for x in "BSNKH")
    w = Workload(B, T, S, N, K, H, "bfloat16", True, kv_lengths=(S,) * B, decode=True,
                 kv_dtype=None if kv is None else kv[0], kv_scale=None if kv is None else kv[1], page_size=page_size)
    return w.bytes(), max(w.bytes() / roofline_peaks()["bandwidth"], w.flops() / roofline_peaks()["peak_flops"]) * 1e3


def run_cells(f, shape, Ts, caches, layouts, dev, t0, max_s, dry):
    """The goal's cells first (bf16 and fp8 per token, every layout and T), then the other caches."""
    import jax

    key = jax.random.PRNGKey(0)
    base = {}                                   # (layout, T) -> the bf16 cache's ms
    for group in (caches[:2], caches[2:]):
        for page_size in layouts:
            for T in Ts:
                for kv in group:
                    if time.perf_counter() - t0 > max_s:
                        return
                    layout = f"paged{page_size}" if page_size else "contig"
                    rec = dict(kind="cell", device=dev, T=T, cache=cache_name(kv), layout=layout, **shape)
                    try:
                        fn, args, checker = make_cell(key, T, kv, page_size, shape)
                        rec["check"] = checker(fn(*args))
                        if rec["check"]["ok"]:
                            rec["ms"] = time_ms(fn, args, dry)
                            rec["bytes"], rec["roofline_ms"] = roofline_ms(T, kv, page_size, shape)
                            rec["pct_roofline"] = 100 * rec["roofline_ms"] / rec["ms"]
                            if kv is None:
                                base[(layout, T)] = rec["ms"]
                            elif (layout, T) in base:
                                rec["speedup_vs_bf16"] = base[(layout, T)] / rec["ms"]
                    except Exception as e:  # noqa: BLE001 - one failing cell must not stop the benchmark
                        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                    print(json.dumps(rec))


#: Tile variants timed beside the default on the fp8 cache (the plan sizes shared memory by q's dtype, so a
#: 1-byte cache may want longer key blocks or deeper pipelines): DecodeConfig fields; absent = the plan's.
#: ``PROBE`` (``--probe``): block sizes, pipeline depths and fewer warps at T=1 (2026-12-05, 4 and 8 warps: fp8 about
#: the bf16 cache's time; a short window ran 1.6x faster in one warp, results/gpu-2026-12-06b-window-tuning).
#: ``MMA`` (``--mma``): the products in q's dtype (bfloat16: FP8 converted through float32) or in float16 (one conversion
#: instruction per pair), and float16 read as int16 pairs (``DecodeConfig.kv_pairs``, results/cpu-2026-12-06-fp8-ttgir).
VARIANTS = tuple(dict(block_k=bk, num_stages=st) for bk, st in ((128, None), (128, 4), (256, None), (256, 3)))
PROBE = tuple(dict(block_k=bk, num_stages=st, num_warps=w) for bk in (32, 64, 128) for st in (2, 3) for w in (1, 2, 4))
MMA = (dict(kv_mma="q"), dict(kv_mma="float16", kv_pairs=False), dict(kv_mma="float16", kv_pairs=True))   # pairs: FP8 only
#: ``ROWS`` (``--rows``): warps and row tiles at T=8, float16 products: the kernel is bound by the instructions it
#: issues (results/cpu-2026-12-05-fp8-sass), and 2 warps a 32-row tile issue 14% less than the plan's 4.
#: Blocks of 128 keys: twice the independent work an iteration (the loop waits on its chains more than it issues).
ROWS = tuple(dict(kv_mma="float16", num_warps=w, block_r=br) for br in (None, 16) for w in (2, 4, 8)) + tuple(
    dict(kv_mma="float16", num_warps=w, block_k=128) for w in (4, 8))
#: ``WHOLE`` (``--whole``): every block masked, against the blocks every row sees whole in an unmasked loop
#: (``DecodeConfig.whole_blocks``; sm_90's loop 10-23% fewer instructions, results/cpu-2026-12-07-whole-blocks)
WHOLE = (dict(whole_blocks=False), dict(whole_blocks=True))


def run_variants(f, shape, dev, t0, max_s, dry, variants=VARIANTS, layouts=(None, 16), Ts=(1, 8),
                 caches=(("float8_e4m3fn", "token"),)):
    """Quantized cells for each kernel variant (``DecodeConfig`` fields), cache, layout (None: contiguous, or
    pages of 16) and T: checked, timed."""
    import jax

    from attnlab.kernels.decode import DecodeConfig

    key = jax.random.PRNGKey(0)
    for kv in caches:
        for page_size in layouts:
            for T in Ts:
                for fields in variants[:1] if dry else variants:
                    if time.perf_counter() - t0 > max_s:
                        return
                    rec = dict(kind="variant", device=dev, T=T, cache=cache_name(kv), layout=f"paged{page_size}"
                               if page_size else "contig", **{k: fields.get(k) for k in ("block_k", "block_r",
                                                                                         "num_stages", "num_warps", "kv_mma", "kv_pairs",
                                                                                         "whole_blocks")}, **shape)
                    try:
                        fn, args, checker = make_cell(key, T, kv, page_size, shape, DecodeConfig(**fields))
                        rec["check"] = checker(fn(*args))
                        if rec["check"]["ok"]:
                            rec["ms"] = time_ms(fn, args, dry)
                            rec["bytes"], rec["roofline_ms"] = roofline_ms(T, kv, page_size, shape)
                            rec["pct_roofline"] = 100 * rec["roofline_ms"] / rec["ms"]
                    except Exception as e:  # noqa: BLE001
                        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                    print(json.dumps(rec))


def run_errors(f, dev, dry):
    from attnlab.measure.kv_cells import kv_cache_errors

    B, T, S, N, K, H = (2, 4, 4096, 32, 8, 128) if not dry else (1, 2, 128, 4, 2, 64)
    for row in kv_cache_errors(B, T, S, N, K, H, kv_dtypes=("float8_e4m3fn", "float8_e5m2", "int8"),
                               implementation="attnlab-decode"):
        rec = dict(kind="error", device=dev, B=B, T=T, S=S, N=N, K=K, H=H, **row)
        f.write(json.dumps(rec) + "\n")
        print(json.dumps(rec))


def table_md(path) -> str:
    recs = [json.loads(x) for x in open(path, encoding="utf-8") if x.strip()]
    lines = ["| T | S | cache | layout | ms | % roofline (own bytes) | x bf16 | goal |", "| --- " * 8 + "|"]
    cells = sorted((r for r in recs if r["kind"] == "cell"), key=lambda r: (r["layout"], r["T"], r["cache"] != "bf16"))
    for r in cells:
        if "ms" not in r:
            why = r.get("error") or f"check failed: rel L2 {r['check']['rel_err']:.3g} > {r['check']['limit']:.3g}"
            lines.append(f"| {r['T']} | {r['S']} | {r['cache']} | {r['layout']} | ✗ {why[:80]} | | | |")
            continue
        sp = r.get("speedup_vs_bf16")
        goal = ""
        if r["cache"].startswith("float8_e4m3fn") and sp is not None:
            ok = sp >= GOAL_SPEEDUP and r["pct_roofline"] >= GOAL_ROOFLINE
            goal = f"{'met' if ok else 'missed'} (>= {GOAL_SPEEDUP}x, >= {GOAL_ROOFLINE:.0f}%)"
        lines.append(f"| {r['T']} | {r['S']} | {r['cache']} | {r['layout']} | {r['ms']:.4f} | {r['pct_roofline']:.0f}% | "
                     f"{'' if sp is None else f'{sp:.2f}'} | {goal} |")
    var = [r for r in recs if r["kind"] == "variant"]
    if var:
        base = {(r["layout"], r["T"]): r["ms"] for r in cells if r["cache"] == "bf16" and "ms" in r}
        lines += ["", "Kernel variants on quantized caches (plan: the plan's value; products: the MMA's dtype):", "",
                  "| T | cache | layout | block_k | block_r | num_stages | num_warps | products | ms | % roofline | x bf16 |",
                  "| --- " * 11 + "|"]
        for r in var:
            sp = base.get((r["layout"], r["T"]))
            x = "" if sp is None or "ms" not in r else f"{sp / r['ms']:.2f}"
            got = (f"{r['ms']:.4f} | {r['pct_roofline']:.0f}% | {x}" if "ms" in r else
                   f"✗ {(r.get('error') or 'check failed')[:60]} | |")
            lines.append(f"| {r['T']} | {r['cache']} | {r['layout']} | {r['block_k'] or 'plan'} | "
                         f"{r.get('block_r') or 'plan'} | {r['num_stages'] or 'plan'} | {r.get('num_warps') or 'plan'} | {r.get('kv_mma') or 'plan'}{' pairs' if r.get('kv_pairs') else ''}{' every block masked' if r.get('whole_blocks') is False else ''} | {got} |")
    errs = [r for r in recs if r["kind"] == "error"]
    if errs:
        names = list(dict.fromkeys(r["kv_dtype"] for r in errs))
        lines += ["", "Error against float64 of the unquantized values (relative L2; per-token scales; "
                  f"B={errs[0]['B']}, T={errs[0]['T']}, S={errs[0]['S']}, attnlab-decode):", "",
                  "| inputs | bf16 K/V | " + " | ".join(names) + " |", "| --- " * (2 + len(names)) + "|"]
        for dist in dict.fromkeys(r["inputs"] for r in errs):
            row = {r["kv_dtype"]: r for r in errs if r["inputs"] == dist}
            lines.append(f"| {dist} | {next(iter(row.values()))['bf16_rel_err']:.2e} | "
                         + " | ".join(f"{row[n]['rel_err']:.2e}" for n in names) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="bf16 and fp8 per token, T in {1, 8}")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes, interpret mode, wall clock (any CPU)")
    ap.add_argument("--max-seconds", type=float, default=150.0, help="no cell is started after it (the errors run after)")
    ap.add_argument("--variant-seconds", type=float, default=40.0, help="time for the tile variants past the limit")
    ap.add_argument("--mma", action="store_true", help="only: bf16 cells and every quantized cache with its "
                    "products in q's dtype and in float16 (MMA), T in {1, 8}, contiguous and paged 16")
    ap.add_argument("--pairs", action="store_true", help="only: bf16 cells and FP8 (e4m3 per token and per tensor, "
                    "e5m2 per token) in float16 products, read as bytes and as int16 pairs (kv_pairs), T in {1, 8}")
    ap.add_argument("--probe", action="store_true", help="only: T=1 contiguous bf16 and fp8 cells, the bf16 cache "
                    "at half the length (the fp8 cache's bytes) and the PROBE tile variants")
    ap.add_argument("--whole", action="store_true", help="only: the WHOLE variants (every block masked, or the whole "
                    "blocks unmasked) on the bf16 cache and e4m3 per token and per tensor, T in {1, 8}, contiguous and paged 16")
    ap.add_argument("--rows", action="store_true", help="only: T=8 contiguous bf16 and fp8 cells and the ROWS tile "
                    "variants (warps, 16-row tiles; float16 products) on e4m3 per token and per tensor")
    a = ap.parse_args(argv)
    out = ResultsFolder(a.out)
    shape, dev, t0 = DRY if a.dry_run else FULL, out.device, out.t0
    with open(out.path, "w") as f:
        if a.mma:
            run_cells(f, shape, (1, 8), CACHES[:1], (None, 16), dev, t0, a.max_seconds, a.dry_run)
            run_variants(f, shape, dev, t0, a.max_seconds, a.dry_run, MMA, (None, 16), (1, 8), CACHES[1:])
        elif a.pairs:
            run_cells(f, shape, (1, 8), CACHES[:1], (None, 16), dev, t0, a.max_seconds, a.dry_run)
            run_variants(f, shape, dev, t0, a.max_seconds, a.dry_run, MMA[1:], (None, 16), (1, 8),
                         (("float8_e4m3fn", "token"), ("float8_e4m3fn", "tensor"), ("float8_e5m2", "token")))
        elif a.whole:
            run_variants(f, shape, dev, t0, a.max_seconds, a.dry_run, WHOLE, (None, 16), (1, 8), CACHES[:3])
        elif a.rows:
            run_cells(f, shape, (8,), CACHES[:1], (None,), dev, t0, a.max_seconds, a.dry_run)
            run_variants(f, shape, dev, t0, a.max_seconds, a.dry_run, ROWS, (None,), (8,),
                         (("float8_e4m3fn", "token"), ("float8_e4m3fn", "tensor")))
        elif a.probe:
            run_cells(f, shape, (1,), CACHES[:2], (None,), dev, t0, a.max_seconds, a.dry_run)
            run_cells(f, dict(shape, S=shape["S"] // 2), (1,), CACHES[:1], (None,), dev, t0, a.max_seconds, a.dry_run)
            run_variants(f, shape, dev, t0, a.max_seconds, a.dry_run, PROBE, (None,), (1,))
        else:
            run_cells(f, shape, (1, 8) if a.quick or a.dry_run else (1, 2, 4, 8),
                      CACHES[:2] if a.quick else CACHES, (None, 16), dev, t0, a.max_seconds, a.dry_run)
            run_errors(f, dev, a.dry_run)
            if not a.quick:
                run_variants(f, shape, dev, t0, a.max_seconds + a.variant_seconds, a.dry_run)
    flags = "".join(f" --{x.replace('_', '-')}" for x in ("mma", "pairs", "whole", "rows", "probe", "quick", "dry_run")
                    if getattr(a, x))
    out.finish("Quantized KV caches", f"python benchmarks/decode/kv_dtype_gpu.py --out {a.out}{flags}", table_md(out.path))


if __name__ == "__main__":
    main()
