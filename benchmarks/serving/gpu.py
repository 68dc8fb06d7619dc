"""serving_attention on the GPU: ragged and mixed serving batches against the roofline of their valid work.

    PYTHONPATH=src python benchmarks/serving/gpu.py --out OUT [--quick | --focus] [--no-peers]
        [--max-seconds 220] [--variant-seconds 25]
    PYTHONPATH=src python benchmarks/serving/gpu.py --out OUT --kv-products | --window [--dry-run]   (fp8_window.py)
    PYTHONPATH=src python benchmarks/serving/gpu.py --out OUT --fused-merge [--dry-run]   (fused_merge.py)

Batches (B=32, S_max=32768, H=128, bf16): lengths uniform (all S), spread (uniform T..S), lognormal (many
short, few long), one-long (one at S, the rest S/32); G in {4, 7} (N/K = 32/8, 56/8); T in {1, 4}; contiguous
and paged caches (pages of 16 and 64). Mixed (S_max=16384): 2 prefill chunks of 2048 + 126 decodes, 8 of
512 + 248. Lengths are traced arguments of ``jax.jit``; the plan is computed from them by its own jitted
function (once per step) and passed to the timed call, as a server passes it to every layer (``plan_ms``:
its own time, set against a 32-layer step). Each cell is checked against float64 on the last <= 8 tokens of
its longest and shortest request first; then CUPTI kernel time, % of the roofline of the valid work
(``core.serving_cost``), the peers (``decode_attention`` with attnlab-decode and cuDNN on the padded batch,
uniform q_len only; the masked xla path where its gather fits), and tile variants (``variants.py``).
Writes ``results.jsonl`` and ``README.md`` (a table) to --out.
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
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))   # the repository root: benchmarks.serving

PAIRS = ((32, 8), (56, 8))
GOAL_DECODE, GOAL_MIXED = 85, 75

from benchmarks.results_folder import ResultsFolder, roofline_peaks  # noqa: E402,I001 (after sys.path)
from benchmarks.serving.batches import (B, H, S, caches, check, class_rooflines, jitted, kernels_ms,  # noqa: E402,I001
                                        lengths_of, mixed_batch, references, starts_of, time_ms)


def run_cell(rec, q, k, v, q_len, kv, table, T, N, K, out_f, peers=True):
    import jax
    import jax.numpy as jnp

    import attnlab
    from attnlab.core.serving_cost import serving_roofline_s
    from attnlab.kernels.serving_plan import ServingConfig

    starts = starts_of(q_len)
    Ttot = int(q.shape[0])
    roof_ms = serving_roofline_s(starts, kv, N, K, H, 2, **roofline_peaks()) * 1e3
    rec.update(roofline_ms=roof_ms, lengths_traced=True, tokens=int(starts[-1]), kv_tokens=int(kv.sum()))
    max_q = int(q_len.max())
    cfg = ServingConfig(max_q_len=max_q if max_q <= 16 else None, decode_q_len=min(int(q_len.min()), 16))
    s_max = int(k.shape[1]) if table is None else int(table.shape[1]) * int(k.shape[1])
    static = (Ttot, len(kv), s_max, N, K, table is None)
    a, b = jnp.asarray(starts), jnp.asarray(kv)
    make_plan = jitted(("plan", cfg, *static), lambda: jax.jit(lambda a, b: attnlab.serving_plan(
        a, b, total_tokens=Ttot, kv_len_max=s_max, heads=N, kv_heads=K, head_dim=H, config=cfg)))
    plan = make_plan(a, b)
    args = (q, k, v, a, b, table)
    serve = jitted(("serving", *static), lambda: jax.jit(
        lambda q, k, v, a, b, t, plan: attnlab.serving_attention(q, k, v, *plan.lengths, page_table=t, plan=plan,
                                                                 implementation="attnlab-decode")))
    paths = {"attnlab-serving": (serve, args + (plan,))}
    if peers and len(set(q_len.tolist())) == 1:
        def dec(impl, q, k, v, a, b, t):
            del a
            return attnlab.decode_attention(q.reshape(len(kv), T, N, H), k, v, b, page_table=t,
                                            implementation=impl).reshape(Ttot, N, H)
        for impl in ("attnlab-decode", "cudnn"):
            paths[f"{impl} (padded)"] = (jitted((impl, *static), lambda: jax.jit(functools.partial(dec, impl))), args)
    if peers and Ttot * s_max * K * H * 4 * 2 <= 24e9:
        paths["xla (masked)"] = (jitted(("xla", *static), lambda: jax.jit(
            lambda q, k, v, a, b, t: attnlab.serving_attention(q, k, v, a, b, page_table=t, implementation="xla"))),
            args)
    refs = references(q, k, v, starts, kv, table)
    for name, (fn, fargs) in paths.items():
        r = dict(rec, path=name)
        try:
            r["check"] = check(fn(*fargs), refs)
            if not all(c["ok"] for c in r["check"]):
                r["error"] = "check failed"
            else:
                r["ms"] = time_ms(fn, fargs)
                r["pct_roofline"] = 100 * roof_ms / r["ms"]
                r["tokens_per_s"] = int(starts[-1]) / (r["ms"] * 1e-3)
                if name.startswith("attnlab-serving"):
                    r["plan_ms"] = time_ms(make_plan, (a, b))
                    try:
                        r["kernels"] = kernels_ms(fn, fargs)
                    except Exception as e:  # noqa: BLE001 - the breakdown is extra
                        r["kernels"], r["kernels_error"] = [], f"{type(e).__name__}: {str(e)[:200]}"
                    dec, pre = class_rooflines(q_len, kv, N, K)
                    r["class_roofline_ms"] = [dec, pre]
                    r["sequential_bound_pct"] = 100 * roof_ms / (dec + pre)
                    pk = [t for n, t in r["kernels"] if "serving_prefill_r" in n]
                    if pre and pk:
                        from attnlab.core.serving_cost import serving_flops
                        sel = q_len > 16
                        r["prefill_tflops"] = serving_flops(starts_of(q_len[sel]), kv[sel], N, H) / (pk[0] * 1e-3) / 1e12
        except Exception as e:  # noqa: BLE001 - a path that fails is a result
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(f"{r['batch']:<24} G={N // K} T={T} {r['layout']:<8} {name:<24} {r.get('ms', 0):8.4f} ms "
              f"{r.get('pct_roofline', 0):5.1f}% {r.get('error', '')[:80]}", flush=True)
        out_f.write(json.dumps(r) + "\n")
        out_f.flush()


def table_md(path) -> str:
    recs = [json.loads(x) for x in open(path, encoding="utf-8") if x.strip()]
    cells, peers = {}, {}
    for r in recs:
        if "variant" in r["batch"]:
            continue
        key = (r["batch"], r["G"], r["T"], r["layout"])
        if r["path"] == "attnlab-serving":
            cells[key] = r
        elif "pct_roofline" in r:
            best = peers.get(key)
            if best is None or r["pct_roofline"] > best["pct_roofline"]:
                peers[key] = r
    lines = ["| batch | G | T | cache | attnlab-serving ms | % roofline | goal | best peer | peer % |",
             "| --- " * 9 + "|"]
    for key, r in cells.items():
        goal = GOAL_MIXED if r["batch"].startswith("mixed") else GOAL_DECODE
        pct = r.get("pct_roofline")
        got = f"{pct:.0f}%" if pct is not None else f"✗ {r.get('error', '')[:40]}"
        verdict = "–" if pct is None else ("met" if pct >= goal else f"missed by {goal - pct:.0f}")
        p = peers.get(key)
        peer = f"{p['path']} | {p['pct_roofline']:.0f}%" if p else "– | –"
        if r.get("sequential_bound_pct") and key[0].startswith("mixed"):
            verdict += (f" (two launches in sequence: at most {r['sequential_bound_pct']:.0f}%; prefill kernel "
                        f"{r.get('prefill_tflops', 0):.0f} TFLOP/s)")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {r.get('ms', 0):.4f} | {got} | {goal}% "
                     f"{verdict} | {peer} |")
    from benchmarks.serving.variants import variants_md

    lines += variants_md(recs)
    plans = [r for r in cells.values() if r.get("plan_ms") and r.get("ms")]
    if plans:
        worst = max(plans, key=lambda r: r["plan_ms"] / r["ms"])
        lines += ["", f"Plan (jnp inside jit, traced lengths): {min(r['plan_ms'] for r in plans):.4f}-"
                  f"{max(r['plan_ms'] for r in plans):.4f} ms; at most {100 * worst['plan_ms'] / (32 * worst['ms']):.2f}% "
                  f"of a 32-layer step's attention ({worst['batch']}, G={worst['G']}, T={worst['T']}, {worst['layout']}); "
                  "goal <= 5%"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="one G, T=1, contiguous and paged 16, no mixed 8x512")
    ap.add_argument("--max-seconds", type=float, default=220.0)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--focus", action="store_true", help="the skewed batches (lognormal, one-long), contiguous "
                    "and paged 16, then the mixed ones")
    ap.add_argument("--variant-seconds", type=float, default=25.0, help="time for the decode variants past the limit")
    ap.add_argument("--wide-rows", action="store_true", help="only the decode class's row-tile variants at G=16, T=8 "
                    "(uniform, lognormal, one-long): 64-row tiles against one 128-row tile")
    ap.add_argument("--kv-products", action="store_true", help="FP8 cache: products in q's dtype against float16 "
                    "(fp8_window.py)")
    ap.add_argument("--window", action="store_true", help="windowed steps: blocks from the first key against from "
                    "its block (fp8_window.py)")
    ap.add_argument("--fused-merge", action="store_true", help="the merge in its own kernel against fused into the "
                    "pieces kernel (ServingConfig.merge; fused_merge.py)")
    ap.add_argument("--whole-blocks", action="store_true", help="the decode class's blocks all masked against its "
                    "whole blocks unmasked (ServingConfig.whole_blocks; fused_merge.py)")
    ap.add_argument("--prefill-slots", action="store_true", help="mixed batches: the prefill chunks on the Triton "
                    "prefill class against the Mosaic GPU slots (ServingConfig.prefill_slots; prefill_slots.py)")
    ap.add_argument("--dry-run", action="store_true", help="with --kv-products / --window / --fused-merge / "
                    "--prefill-slots: tiny, interpret mode")
    a = ap.parse_args(argv)
    import jax

    out = ResultsFolder(a.out)
    path, t0, dev = out.path, out.t0, out.device
    if a.prefill_slots:
        from benchmarks.serving import prefill_slots as ps

        with open(path, "w") as f:
            ps.run(f, dev, t0, a.max_seconds, a.dry_run)
        out.finish("serving_attention: prefill chunks on the Mosaic GPU kernel",
                   f"python benchmarks/serving/gpu.py --out {a.out} --max-seconds {a.max_seconds:g} --prefill-slots",
                   ps.tables_md(path))
        return
    if a.kv_products or a.window or a.fused_merge or a.whole_blocks:
        from benchmarks.serving import fp8_window as fw
        from benchmarks.serving import fused_merge as fm

        whole = functools.partial(fm.run, kind="whole-blocks")
        with open(path, "w") as f:
            for flag, run in ((a.kv_products, fw.kv_products), (a.window, fw.window), (a.fused_merge, fm.run),
                              (a.whole_blocks, whole)):
                if flag:
                    run(f, dev, t0, a.max_seconds, a.dry_run)
        flags = (" --kv-products" * a.kv_products + " --window" * a.window + " --fused-merge" * a.fused_merge
                 + " --whole-blocks" * a.whole_blocks + " --dry-run" * a.dry_run)
        title = ("serving_attention: merge fused" if a.fused_merge else "serving_attention: whole blocks unmasked"
                 if a.whole_blocks else "serving_attention: FP8 products, window starts")
        out.finish(title, f"python benchmarks/serving/gpu.py --out {a.out} --max-seconds {a.max_seconds:g}{flags}",
                   fw.tables_md(path) + (fm.tables_md(path) if a.fused_merge else "")
                   + (fm.tables_md(path, "whole-blocks") if a.whole_blocks else ""))
        return
    key = jax.random.PRNGKey(0)
    pairs = PAIRS[:1] if a.quick else PAIRS
    layouts = ("contig", "paged16") if a.quick or a.focus else ("contig", "paged16", "paged64")
    dists = ("lognormal", "one-long") if a.focus else ("uniform", "spread", "lognormal", "one-long")
    if a.wide_rows:
        from benchmarks.serving.variants import WIDE_ROWS_VARIANTS, decode_variants

        with open(path, "w") as f:
            for N in (128, 96):
                decode_variants(f, key, dev, t0, a.max_seconds, N=N, T=8, dists=("uniform", "lognormal", "one-long"),
                                variants=WIDE_ROWS_VARIANTS)
        out.finish("serving_attention's decode row tiles", f"python benchmarks/serving/gpu.py --out {a.out} --wide-rows",
                   table_md(path))
        return
    with open(path, "w") as f:
        for N, K in pairs:
            for layout in layouts:
                k, v, table = caches(key, B, S, K, layout)
                for T in ((1,) if a.quick else (1, 4)):
                    for dist in dists:
                        if time.perf_counter() - t0 > a.max_seconds:
                            break
                        rng = np.random.default_rng(7)
                        kv = lengths_of(dist, T, rng)
                        q = jax.random.normal(jax.random.PRNGKey(T), (B * T, N, H), jax.numpy.bfloat16)
                        rec = dict(device=dev, batch=dist, B=B, S=S, H=H, N=N, K=K, G=N // K, T=T, layout=layout)
                        run_cell(rec, q, k, v, np.full(B, T, np.int32), kv, table, T, N, K, f, peers=not a.no_peers)
                del k, v, table
        s_mix = 16384
        for chunks, chunk, decodes in ((2, 2048, 126),) + (() if a.quick else ((8, 512, 248),)):
            for N, K in pairs:
                for layout in layouts[:2]:
                    if time.perf_counter() - t0 > a.max_seconds:
                        break
                    rng = np.random.default_rng(3)
                    q_len, kv = mixed_batch(chunks, chunk, decodes, s_mix, rng)
                    k, v, table = caches(key, len(kv), s_mix, K, layout)
                    q = jax.random.normal(jax.random.PRNGKey(5), (int(q_len.sum()) + 64, N, H), jax.numpy.bfloat16)
                    rec = dict(device=dev, batch=f"mixed {chunks}x{chunk}+{decodes}", B=len(kv), S=s_mix, H=H, N=N,
                               K=K, G=N // K, T=1, layout=layout)
                    run_cell(rec, q, k, v, q_len, kv, table, 1, N, K, f, peers=not a.no_peers)
                    del k, v, table
        if not a.quick:
            from benchmarks.serving.variants import decode_variants, prefill_variants

            # the decode variants get --variant-seconds past the limit; the prefill ones what is left of it
            decode_variants(f, key, dev, t0, max(a.max_seconds, time.perf_counter() - t0) + a.variant_seconds)
            prefill_variants(f, key, dev, t0, a.max_seconds + a.variant_seconds)
    out.finish("serving_attention", f"python benchmarks/serving/gpu.py --out {a.out}", table_md(path))


if __name__ == "__main__":
    main()
