"""Tile variants for ``benchmarks/serving/gpu.py`` (run at its end, within its time limit): decode programs,
block_k and depth on the skewed batches, prefill tiles on a mixed batch; and (``--wide-rows``) the decode
class's row tile where T x G passes 64 rows.
Each variant is checked against float64 before it is timed; its kernels are timed one by one (CUPTI).
"""
from __future__ import annotations

import json
import time

import numpy as np

from benchmarks.serving import batches as g
from benchmarks.results_folder import roofline_peaks


#: decode tile variants (programs per KV head, block_k, num_stages) on the skewed batches (G=4, T=1,
#: contiguous); None: the default (33 programs per KV head = 2 per SM at K=8, block_k 64, 3 stages)
DECODE_VARIANTS = ((None, None, None), (None, 128, None), (49, None, None), (16, None, None), (None, 32, None),
                   (None, None, 4))


def _time_into(r, fn, args, refs, roof_ms):
    """Check ``fn(*args)`` against float64, then time its kernels (CUPTI) into ``r``; an error is a result."""
    try:
        r["check"] = g.check(fn(*args), refs)
        if not all(c["ok"] for c in r["check"]):
            raise RuntimeError(f"check failed: {r['check']}")
        r["kernels"] = g.kernels_ms(fn, args)
        r["ms"] = sum(t for _, t in r["kernels"])
        r["pct_roofline"] = 100 * roof_ms / r["ms"]
    except Exception as e:  # noqa: BLE001 - a variant that fails is a result
        r["error"] = f"{type(e).__name__}: {str(e)[:300]}"


def decode_variants(out_f, key, dev, t0, max_seconds, *, N=32, T=1, dists=("lognormal", "one-long"),
                    variants=None):
    """Decode batches (by default the skewed ones at G=4, T=1) by program count, block_k, pipeline depth and
    rows per tile (``variants``: (programs, block_k, num_stages, block_r_decode) tuples; default
    ``DECODE_VARIANTS`` with the plan's rows)."""
    import jax
    import jax.numpy as jnp

    import attnlab
    from attnlab.core.serving_cost import serving_roofline_s
    from attnlab.kernels.serving_plan import ServingConfig

    K = 8
    k, v, _ = g.caches(key, g.B, g.S, K, "contig")
    q = jax.random.normal(jax.random.PRNGKey(1), (g.B * T, N, g.H), jnp.bfloat16)
    starts = g.starts_of(np.full(g.B, T, np.int32))
    fn = jax.jit(lambda q, k, v, a, b, p: attnlab.serving_attention(q, k, v, *p.lengths, plan=p,
                                                                     implementation="attnlab-decode"))
    cells = []
    for dist in dists:
        kv = g.lengths_of(dist, T, np.random.default_rng(7))
        cells.append((dist, kv, g.references(q, k, v, starts, kv, None),
                      serving_roofline_s(starts, kv, N, K, g.H, 2, **roofline_peaks()) * 1e3))
    for programs, bk, stages, rows, *pieces in variants or [v + (None,) for v in DECODE_VARIANTS]:   # each on every batch
        piece_blocks = pieces[0] if pieces else 0
        for dist, kv, refs, roof_ms in cells:
            if time.perf_counter() - t0 > max_seconds:
                return
            cfg = ServingConfig(max_q_len=T, decode_q_len=T, programs=programs, block_k=bk, num_stages=stages,
                                block_r_decode=rows, piece_blocks=piece_blocks)
            r = dict(device=dev, batch=f"decode variant {dist}", path="attnlab-serving", N=N, K=K, G=N // K, T=T,
                     layout="contig", programs=programs, block_k=bk, num_stages=stages, block_r_decode=rows,
                     piece_blocks=piece_blocks)
            plan = attnlab.serving_plan(jnp.asarray(starts), jnp.asarray(kv), total_tokens=g.B * T, kv_len_max=g.S,
                                        heads=N, kv_heads=K, head_dim=g.H, config=cfg)
            _time_into(r, fn, (q, k, v, jnp.asarray(starts), jnp.asarray(kv), plan), refs, roof_ms)
            print(f"decode variant {dist} G={N // K} T={T} programs={programs} block_k={bk} stages={stages} "
                  f"rows={rows} piece_blocks={piece_blocks}: "
                  f"{r.get('ms') or 0:.4f} ms "
                  f"{r.get('pct_roofline') or 0:.0f}% {r.get('error', '')[:100]}", flush=True)
            out_f.write(json.dumps(r) + "\n")
            out_f.flush()


#: ``--wide-rows``: T x G = 96 and 128 rows per KV head (G=12 and 16, T=8), where the grid measured 32-46% with
#: 64-row tiles (each request's keys read by two tiles, results/gpu-2026-12-05-serving-grid): one tile of 128
#: rows (the plan's default since results/gpu-2026-12-05b-serving-wide-rows) reads them once; and a piece's
#: start weighed as 4 blocks in the balance (``ServingConfig.piece_blocks``, predicted to help the one program per
#: SM of 128-row tiles on skewed batches: results/cpu-2026-12-05-serving-sass).
#: (programs, block_k, num_stages, block_r_decode[, piece_blocks])
WIDE_ROWS_VARIANTS = ((None, None, None, 64), (None, None, None, None), (None, None, None, None, 4),
                      (None, 32, None, None))


#: prefill tile variants (block_k, num_warps, num_stages) timed on the 2 x 2048 + 126 mixed batch, G=4
PREFILL_VARIANTS = ((64, 8, 3), (128, 8, 2), (64, 4, 3), (128, 8, 3), (32, 4, 3))


def prefill_variants(out_f, key, dev, t0, max_seconds):
    """The prefill class's kernel time by tile variant (the decode class unchanged): TFLOP/s of the chunks."""
    import jax
    import jax.numpy as jnp

    import attnlab
    from attnlab.core.serving_cost import serving_flops
    from attnlab.kernels.serving_plan import ServingConfig

    N, K, s_mix = 32, 8, 16384
    q_len, kv = g.mixed_batch(2, 2048, 126, s_mix, np.random.default_rng(3))
    starts = g.starts_of(q_len)
    k, v, _ = g.caches(key, len(kv), s_mix, K, "contig")
    q = jax.random.normal(jax.random.PRNGKey(5), (int(q_len.sum()) + 64, N, g.H), jnp.bfloat16)
    from attnlab.core.serving_cost import serving_roofline_s

    flops = serving_flops(g.starts_of(q_len[:2]), kv[:2], N, g.H)
    refs = g.references(q, k, v, starts, kv, None)
    roof_ms = serving_roofline_s(starts, kv, N, K, g.H, 2, **roofline_peaks()) * 1e3
    fn = jax.jit(lambda q, k, v, a, b, p: attnlab.serving_attention(q, k, v, *p.lengths, plan=p,
                                                                     implementation="attnlab-decode"))
    for bk, warps, stages in PREFILL_VARIANTS:
        if time.perf_counter() - t0 > max_seconds:
            break
        cfg = ServingConfig(block_k_prefill=bk, num_warps_prefill=warps, num_stages_prefill=stages)
        r = dict(device=dev, batch="prefill variant", path="attnlab-serving", N=N, K=K, G=N // K, T=1, layout="contig",
                 block_k=bk, num_warps=warps, num_stages=stages)
        plan = attnlab.serving_plan(jnp.asarray(starts), jnp.asarray(kv), total_tokens=int(q.shape[0]),
                                    kv_len_max=s_mix, heads=N, kv_heads=K, head_dim=g.H, config=cfg)
        _time_into(r, fn, (q, k, v, jnp.asarray(starts), jnp.asarray(kv), plan), refs, roof_ms)
        pk = [t for n, t in r.get("kernels", []) if "serving_prefill_r" in n]
        r["prefill_ms"] = pk[0] if pk else None
        r["prefill_tflops"] = flops / (pk[0] * 1e-3) / 1e12 if pk else None
        print(f"prefill variant bk={bk} warps={warps} stages={stages}: {r.get('prefill_ms') or 0:.4f} ms "
              f"{r.get('prefill_tflops') or 0:.0f} TFLOP/s; call {r.get('ms') or 0:.4f} ms "
              f"{r.get('pct_roofline') or 0:.0f}% {r.get('error', '')[:100]}", flush=True)
        out_f.write(json.dumps(r) + "\n")
        out_f.flush()



def variants_md(recs) -> list[str]:
    """The variants' tables (markdown lines) from the records."""
    lines: list[str] = []
    dvars = [r for r in recs if r["batch"].startswith("decode variant")]
    if dvars:
        lines += ["", "Decode variants (B=32, contiguous; None = the default: 33 programs per KV head, block_k 64, "
                  "3 stages, rows per tile up to 128, a piece weighs 0 blocks), with each call's kernels:", "",
                  "| batch | G | T | programs | block_k | stages | rows per tile | piece blocks | ms | % roofline | "
                  "kernels (ms) |", "| --- " * 11 + "|"]
        lines += [f"| {r['batch'][15:]} | {r['G']} | {r['T']} | {r['programs']} | {r['block_k']} | {r['num_stages']} | "
                  f"{r.get('block_r_decode')} | {r.get('piece_blocks') or 0} | {r.get('ms') or 0:.4f} | "
                  f"{r.get('pct_roofline') or 0:.0f}% | "
                  + (", ".join(f"{n.split('attnlab_serving_')[-1][:24]} {t:.4f}" for n, t in r.get("kernels", []))
                     or f"✗ {r.get('error', '')[:60]}") + " |" for r in dvars]
    variants = [r for r in recs if r["batch"] == "prefill variant"]
    if variants:
        lines += ["", "Prefill tile variants (mixed 2x2048+126, G=4, contiguous): the prefill kernel and the whole call",
                  "", "| block_k | warps | stages | prefill kernel ms | TFLOP/s | call ms | % roofline |",
                  "| --- " * 7 + "|"]
        lines += [f"| {r['block_k']} | {r['num_warps']} | {r['num_stages']} | " + (
                  f"{r.get('prefill_ms') or 0:.4f} | {r.get('prefill_tflops') or 0:.0f} | {r.get('ms') or 0:.4f} | "
                  f"{r.get('pct_roofline') or 0:.0f}% |" if not r.get("error") else f"✗ {r['error'][:60]} | | | |")
                  for r in variants]
    return lines
