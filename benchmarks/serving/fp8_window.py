"""Two A/B runs of the serving kernel for ``benchmarks/serving/gpu.py``: an FP8 cache's products and a window's start.

    PYTHONPATH=src python benchmarks/serving/gpu.py --out OUT --kv-products [--max-seconds 200]
    PYTHONPATH=src python benchmarks/serving/gpu.py --out OUT --window [--max-seconds 200]
    PYTHONPATH=src JAX_PLATFORMS=cpu python benchmarks/serving/gpu.py --out OUT --kv-products --dry-run   # any CPU

``--kv-products``: decode batches (B=32, S=32768, N/K=32/8, H=128, q bf16; lengths uniform (every request at S),
lognormal and one-long; T in {1, 4}; contiguous and pages of 16) on the bf16 cache, then on FP8 (e4m3, per-token
scales) with the products in q's dtype and in float16 (``ServingConfig.kv_mma`` "q" / "float16"; float16 is the
default, and since 7b2a316 reads the cache as int16 pairs, ``ServingConfig.kv_pairs``). ``--window``: bf16 windowed steps, ``local_window_size`` W in {128, 1024} (W keys before each token and
itself): uniform and lognormal decode batches at T in {1, 4} and a mixed batch (2 chunks of 2048 + 126 decodes,
S=16384), contiguous and pages of 16, each unit's blocks from its first key and from the block boundary before it
(``ServingConfig.window_from_key`` True / False, the layout before it). Every cell is checked against float64 first
(the last <= 8 tokens of its longest and shortest request, of the dequantized cache, on the window), then its
kernels are timed (CUPTI, every kernel of the call), against the roofline of the cell's own bytes (an FP8 cache's
with its scales; a window's keys only). Lengths are traced, the plan made by its own jitted function.
``--dry-run``: B=4, S=256, N/K=8/2, H=16 in Pallas interpret mode, the wall clock (checks that every cell runs).
"""
from __future__ import annotations

import json
import time

import numpy as np

from benchmarks.serving import ab_table as ab
from benchmarks.serving import batches as g

FULL = dict(B=32, S=32768, N=32, K=8, H=128, S_mix=16384, mixed=(2, 2048, 126))
DRY = dict(B=4, S=256, N=8, K=2, H=16, S_mix=256, mixed=(1, 40, 3))
PRODUCTS = (None, "q", "float16")          # None: the bf16 cache
WINDOWS = (128, 1024)


def _time(fn, args, dry: bool) -> float:
    if not dry:
        return g.time_ms(fn, args)
    import jax

    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return (time.perf_counter() - t) * 1e3


def _step(shape, page, T_total, cfg, window):
    """(jitted plan maker, jitted step) of one static configuration, shared by the cells that differ only in their
    (traced) lengths."""
    import jax

    import attnlab

    s, N, K, H = shape["S"], shape["N"], shape["K"], shape["H"]

    def make():
        plan = jax.jit(lambda a, b: attnlab.serving_plan(a, b, total_tokens=T_total, kv_len_max=s, heads=N, kv_heads=K,
                                                         head_dim=H, config=cfg, local_window_size=window,
                                                         page_size=page))
        step = jax.jit(lambda q, k, v, a, b, t, ks, vs, p: attnlab.serving_attention(
            q, k, v, *p.lengths, page_table=t, k_scale=ks, v_scale=vs, plan=p, local_window_size=window,
            implementation="attnlab-decode"))
        return plan, step

    return g.jitted(("fp8_window", s, N, K, H, shape["B"], page, T_total, cfg, window), make)


def _caches(key, shape, s, page, fp8):
    """(k, v, table, k_scale, v_scale, contiguous truth (k, v, token scales or None)) of one layout."""
    import jax
    import jax.numpy as jnp

    import attnlab
    from attnlab.kernels.pages import to_pages

    k1, k2 = jax.random.split(key)
    B, K, H = shape["B"], shape["K"], shape["H"]
    k, v = (jax.random.normal(x, (B, s, K, H), jnp.bfloat16) for x in (k1, k2))
    truth, ks, vs = (k, v, None), None, None
    if fp8:     # per-token scales: quantizing pages token by token gives the contiguous cache's values
        (kc, kcs), (vc, vcs) = (attnlab.quantize_kv_cache(x, "fp8", "token") for x in (k, v))
        truth = (kc, vc, (kcs, vcs))
    table = None
    if page:
        k, v, table = to_pages(k, v, page, seed=0)
        table = jnp.asarray(table)
    if fp8:
        (k, ks), (v, vs) = (attnlab.quantize_kv_cache(x, "fp8", "token") for x in (k, v))
    return k, v, table, ks, vs, truth


def _run(out_f, rec, fn, args, refs, roof_ms, dry, kernels=False,
         keys=("kind", "batch", "T", "layout", "kv_mma", "W", "from_key")):
    """Check ``fn(*args)`` against ``refs``, then time it (CUPTI; ``dry``: wall clock) and, with ``kernels``, each of
    its kernels; write ``rec`` to ``out_f`` (an error is a result) and print its ``keys``."""
    try:
        rec["check"] = g.check(fn(*args), refs)
        if not all(c["ok"] for c in rec["check"]):
            rec["error"] = "check failed"
        else:
            rec["ms"] = _time(fn, args, dry)
            if kernels and not dry:
                try:
                    rec["kernels"] = g.kernels_ms(fn, args)
                except Exception as e:  # noqa: BLE001 - the breakdown is extra
                    rec["kernels"], rec["kernels_error"] = [], f"{type(e).__name__}: {str(e)[:200]}"
            rec["pct_roofline"] = 100 * roof_ms / rec["ms"]
    except Exception as e:  # noqa: BLE001 - a cell that fails is a result
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(" ".join(f"{k}={rec.get(k)}" for k in keys),
          f"{rec.get('ms') or 0:.4f} ms {rec.get('pct_roofline') or 0:.0f}% {rec.get('error') or ''}"[:200], flush=True)
    out_f.write(json.dumps(rec) + "\n")
    out_f.flush()


def _batches(shape, T, dists):
    """(distribution, q lengths, KV lengths) of decode batches of T tokens a request (seed 7, as gpu.py's)."""
    for dist in dists:
        kv = g.draw(dist, shape["B"], T, shape["S"], np.random.default_rng(7))
        yield dist, np.full(shape["B"], T, np.int32), kv


def kv_products(out_f, dev, t0, max_seconds, dry=False):
    """``--kv-products`` (module docstring): one record per cell into ``out_f``; stops starting cells past
    ``max_seconds`` after ``t0``."""
    import jax
    import jax.numpy as jnp

    from attnlab.core.serving_cost import serving_roofline_s
    from attnlab.kernels.serving_plan import ServingConfig

    shape = DRY if dry else FULL
    N, K, H = shape["N"], shape["K"], shape["H"]
    peaks, truths = g.roofline_peaks(), {}
    for page in (None, 16):
        for mma in PRODUCTS:
            k, v, table, ks, vs, (tk, tv, tsc) = _caches(jax.random.PRNGKey(0), shape, shape["S"], page, mma is not None)
            for T in (1, 4):
                T_total = shape["B"] * T
                q = jax.random.normal(jax.random.PRNGKey(T), (T_total, N, H), jnp.bfloat16)
                cfg = ServingConfig(max_q_len=T, decode_q_len=T, kv_mma=mma)
                plan, step = _step(shape, page, T_total, cfg, None)
                for dist, q_len, kv in _batches(shape, T, ("uniform", "lognormal", "one-long")):
                    if time.perf_counter() - t0 > max_seconds:
                        return
                    starts = g.starts_of(q_len)
                    a, b = jnp.asarray(starts), jnp.asarray(kv)
                    # the truth reads the contiguous cache: the same for both layouts and both products
                    rkey = (mma is not None, T, dist)
                    if rkey not in truths:
                        truths[rkey] = g.references(q, tk, tv, starts, kv, None, token_scales=tsc)
                    refs = truths[rkey]
                    fp8 = dict(kv_itemsize=1, kv_scale="token") if mma else {}
                    roof_ms = serving_roofline_s(starts, kv, N, K, H, 2, **fp8, **peaks) * 1e3
                    rec = dict(kind="kv-products", device=dev, batch=dist, T=T, layout=f"paged{page}" if page else "contig",
                               cache="fp8:token" if mma else "bf16", kv_mma=mma, roofline_ms=roof_ms, dry_run=dry,
                               **{x: shape[x] for x in "BSNKH"})
                    _run(out_f, rec, step, (q, k, v, a, b, table, ks, vs, plan(a, b)), refs, roof_ms, dry)
            del k, v, table, ks, vs, tk, tv, tsc


def window(out_f, dev, t0, max_seconds, dry=False):
    """``--window`` (module docstring): one record per cell into ``out_f``; stops starting cells past
    ``max_seconds`` after ``t0``."""
    import jax
    import jax.numpy as jnp

    from attnlab.core.serving_cost import serving_roofline_s
    from attnlab.kernels.serving_plan import ServingConfig

    shape = DRY if dry else FULL
    N, K, H = shape["N"], shape["K"], shape["H"]
    peaks, truths = g.roofline_peaks(), {}      # the truth reads the contiguous cache: one for both layouts
    n_chunks, chunk, decodes = shape["mixed"]
    for page in (None, 16):
        for mixed in (False, True):
            s = shape["S_mix"] if mixed else shape["S"]
            b_shape = dict(shape, S=s, B=n_chunks + decodes if mixed else shape["B"])
            k, v, table, _, _, (tk, tv, _) = _caches(jax.random.PRNGKey(0), b_shape, s, page, False)
            if mixed:
                q_len, kv = g.mixed_batch(n_chunks, chunk, decodes, s, np.random.default_rng(3))
                cells = [(f"mixed {n_chunks}x{chunk}+{decodes}", 1, q_len, kv)]
            else:
                cells = [(d, T, q_len, kv) for T in (1, 4)
                         for d, q_len, kv in _batches(shape, T, ("uniform", "lognormal"))]
            for dist, T, q_len, kv in cells:
                starts = g.starts_of(q_len)
                T_total = int(starts[-1]) + (64 if mixed else 0)
                q = jax.random.normal(jax.random.PRNGKey(T), (T_total, N, H), jnp.bfloat16)
                a, b = jnp.asarray(starts), jnp.asarray(kv)
                max_q = int(q_len.max())
                for W in WINDOWS if not dry else (16, 40):
                    if (dist, T, W) not in truths:
                        truths[dist, T, W] = g.references(q, tk, tv, starts, kv, None, window_left=W)
                    refs = truths[dist, T, W]
                    roof_ms = serving_roofline_s(starts, kv, N, K, H, 2, window_left=W, **peaks) * 1e3
                    for from_key in (False, True):
                        if time.perf_counter() - t0 > max_seconds:
                            return
                        cfg = ServingConfig(max_q_len=max_q if max_q <= 16 else None,
                                            decode_q_len=min(int(q_len.min()), 16), window_from_key=from_key)
                        plan, step = _step(b_shape, page, T_total, cfg, W)
                        rec = dict(kind="window", device=dev, batch=dist, T=T, W=W, from_key=from_key,
                                   roofline_ms=roof_ms, layout=f"paged{page}" if page else "contig", dry_run=dry,
                                   **{x: b_shape[x] for x in "BSNKH"})
                        _run(out_f, rec, step, (q, k, v, a, b, table, None, None, plan(a, b)), refs, roof_ms, dry)
            del k, v, table, tk, tv


def tables_md(path) -> str:
    """The A/B tables (markdown) of the records in ``path``."""
    recs = ab.read(path)
    prod = ab.ab_table(
        recs, kind="kv-products", cell=("batch", "T", "layout"), variant="kv_mma", variants=PRODUCTS,
        ratios=((1, 2), (0, 2)),
        title="FP8 (e4m3, per-token scales) serving decode: ms (% of the roofline of the cell's own bytes); speed-ups "
              "of the float16 products over q's dtype and over the bf16 cache",
        headers=("batch", "T", "cache", "bf16 cache", "fp8, products in bf16", "fp8, float16",
                 "float16 / bf16 products", "fp8 float16 / bf16 cache"))
    win = ab.ab_table(
        recs, kind="window", cell=("batch", "T", "W", "layout"), variant="from_key", variants=(False, True),
        title="Windowed serving steps (bf16): ms (% of the roofline of the window's bytes), each unit's blocks "
              "from the block boundary before its first key and from that key",
        headers=("batch", "T", "W", "cache", "from its block", "from its first key", "speed-up"))
    return "\n".join(prod + ([""] if prod and win else []) + win) + "\n"
