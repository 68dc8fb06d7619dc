"""A/B runs of the serving kernel for ``benchmarks/serving/gpu.py``: the merge in its own kernel against fused
(``--fused-merge``), and the decode class's blocks all masked against its whole blocks unmasked (``--whole-blocks``,
``ServingConfig.whole_blocks``; the decode kernel's sm_90 loop 10-23% fewer instructions,
results/cpu-2026-12-07-whole-blocks).

    PYTHONPATH=src python benchmarks/serving/gpu.py --out OUT --fused-merge [--max-seconds 200]
    PYTHONPATH=src JAX_PLATFORMS=cpu python benchmarks/serving/gpu.py --out OUT --whole-blocks --dry-run   # any CPU

Decode batches as gpu.py's (B=32, S=32768, K=8, H=128, bf16; lengths uniform, spread, lognormal and one-long, seed
7; G=4 at T in {1, 4}, and G=16 at T=8: one 128-row tile a request, where the merge weighed most,
results/gpu-2026-12-05c-serving-wide-rows; contiguous and pages of 16) and its mixed one (2 chunks of 2048 + 126
decodes, S=16384, G=4: both tile classes), each with ``ServingConfig.merge`` "kernel" (a merge kernel per class
after its pieces kernel, on a zero-filled output) and "fused" (the pieces kernel merges a unit at its last piece;
one launch per class), or with ``ServingConfig.whole_blocks`` False and True. Every
cell is checked against float64 first (the last <= 8 tokens of its longest and shortest request), then timed
(CUPTI, every kernel of the call: their names and medians), against the roofline of its valid bytes
(``core.serving_cost``). Lengths are traced, the plan made by its own jitted function.
``--dry-run``: B=4, S=256, N/K=8/2, H=16 in Pallas interpret mode, the wall clock (checks that every cell runs).
"""
from __future__ import annotations

import time

import numpy as np

from benchmarks.serving import ab_table as ab
from benchmarks.serving import batches as g
from benchmarks.serving.fp8_window import DRY, FULL, _batches, _caches, _run, _step

MERGES = ("kernel", "fused")
#: kind -> (the ServingConfig field, its values A and B)
AB = {"fused-merge": ("merge", MERGES), "whole-blocks": ("whole_blocks", (False, True))}
DISTS = ("uniform", "spread", "lognormal", "one-long")


def _cells(shape):
    """(batch, T, N, q lengths, KV lengths, S) of the decode batches (G=4, then G=16 at T=8), then the mixed one."""
    for T, N, dists in ((1, shape["N"], DISTS), (8, 4 * shape["N"], DISTS[:1] + DISTS[2:]), (4, shape["N"], DISTS)):
        for dist, q_len, kv in _batches(shape, T, dists):
            yield dist, T, N, q_len, kv, shape["S"]
    n_chunks, chunk, decodes = shape["mixed"]
    q_len, kv = g.mixed_batch(n_chunks, chunk, decodes, shape["S_mix"], np.random.default_rng(3))
    yield f"mixed {n_chunks}x{chunk}+{decodes}", 1, shape["N"], q_len, kv, shape["S_mix"]


def run(out_f, dev, t0, max_seconds, dry=False, kind="fused-merge"):
    """``--fused-merge`` or ``--whole-blocks`` (``kind``, module docstring): one record per cell and value into
    ``out_f``; stops starting cells past ``max_seconds`` after ``t0``."""
    import jax
    import jax.numpy as jnp

    from attnlab.core.serving_cost import serving_roofline_s
    from attnlab.kernels.serving_plan import ServingConfig

    shape = DRY if dry else FULL
    K, H = shape["K"], shape["H"]
    peaks, caches = g.roofline_peaks(), {}
    for page in (None, 16):
        for dist, T, N, q_len, kv, s in _cells(shape):
            b_shape = dict(shape, S=s, B=len(kv), N=N)
            if (s, len(kv)) not in caches:      # one cache per layout and shape, its truth the contiguous one
                caches.clear()
                caches[s, len(kv)] = _caches(jax.random.PRNGKey(0), b_shape, s, page, False)
            k, v, table, _, _, (tk, tv, _) = caches[s, len(kv)]
            starts = g.starts_of(q_len)
            mixed = dist.startswith("mixed")
            T_total = int(starts[-1]) + (64 if mixed else 0)
            q = jax.random.normal(jax.random.PRNGKey(T), (T_total, N, H), jnp.bfloat16)
            a, b = jnp.asarray(starts), jnp.asarray(kv)
            refs = g.references(q, tk, tv, starts, kv, None)
            roof_ms = serving_roofline_s(starts, kv, N, K, H, 2, **peaks) * 1e3
            max_q = int(q_len.max())
            field, values = AB[kind]
            for value in values:
                if time.perf_counter() - t0 > max_seconds:
                    return
                cfg = ServingConfig(max_q_len=max_q if max_q <= 16 else None, decode_q_len=min(int(q_len.min()), 16),
                                    **{field: value})
                plan, step = _step(b_shape, page, T_total, cfg, None)
                rec = dict(kind=kind, device=dev, batch=dist, G=N // K, T=T, roofline_ms=roof_ms, lengths_traced=True,
                           layout=f"paged{page}" if page else "contig", dry_run=dry, **{field: value},
                           **{x: b_shape[x] for x in "BSNKH"})
                args = (q, k, v, a, b, table, None, None, plan(a, b))
                _run(out_f, rec, step, args, refs, roof_ms, dry, kernels=True, keys=("batch", "G", "T", "layout", field))
        caches.clear()


#: kind -> (title, headers) of its table
TABLES = {
    "fused-merge": ("Serving steps (bf16): ms (% of the roofline of the valid bytes), the merge in its own kernel "
                    "against fused into the pieces kernel; the fused call's kernels and the merge kernel's",
                    ("batch", "G", "T", "cache", "merge kernel", "fused", "speed-up", "fused: kernels",
                     "merge kernel: kernels")),
    "whole-blocks": ("Serving steps (bf16): ms (% of the roofline of the valid bytes), the decode class's blocks all "
                     "masked against its whole blocks unmasked (ServingConfig.whole_blocks); each call's kernels",
                     ("batch", "G", "T", "cache", "all masked", "whole unmasked", "speed-up", "unmasked: kernels",
                      "masked: kernels")),
}


def tables_md(path, kind="fused-merge") -> str:
    """The A/B table (markdown) of ``kind``'s records in ``path``."""
    (field, values), (title, headers) = AB[kind], TABLES[kind]
    return "\n".join(ab.ab_table(ab.read(path), kind=kind, cell=("batch", "G", "T", "layout"), variant=field,
                                 variants=values, title=title, headers=headers, kernels_of=(1, 0))) + "\n"
