"""An A/B run of the serving step for ``benchmarks/serving/gpu.py``: mixed batches with their prefill chunks on the
serving kernel's Triton prefill class (the default) against the Mosaic GPU kernel's slots
(``ServingConfig(prefill_slots=chunks, prefill_chunk=chunk)``, ``kernels.serving_prefill_mgpu``).

    PYTHONPATH=src python benchmarks/serving/gpu.py --out OUT --prefill-slots [--max-seconds 200]

Mixed batches as gpu.py's (2 chunks of 2048 + 126 decodes and 8 chunks of 512 + 248; S=16384, K=8, H=128, bf16,
lengths seed 3) at G=4 and 7, contiguous and pages of 16; the 512-token chunks also in slots of 2048 (their padding
tiles read no key), and the slots on their own CUDA stream beside the Triton classes (``prefill_stream=1``; and with
the Triton classes on half their programs, ``programs``, so that the SMs can split between the two kernels: CUPTI
sums the kernels, so these steps are also timed by the host clock around 20 queued calls, kind
"prefill-slots-wall", every variant). Each call is checked against float64 first (the last
<= 8 tokens of the longest and shortest request and of the first and last chunk; every row finite), then timed
(CUPTI, every kernel of the call), against the combined roofline of the valid work (``core.serving_cost``:
max(FLOPs / peak, bytes / bandwidth)). Lengths are traced, the plan made by its own jitted function.
"""
from __future__ import annotations

import json
import time

import numpy as np

from benchmarks.serving import ab_table as ab
from benchmarks.serving import batches as g
from benchmarks.serving.fp8_window import DRY, FULL, _caches, _run, _step

MIXED = ((2, 2048, 126), (8, 512, 248))
#: the variants' labels: the Triton class; the slots sized to the chunks; slots of ``BOUND`` tokens (a server's static
#: chunk bound) holding shorter chunks, whose padding tiles read no key (``decode_mgpu``'s q_first)
#: own stream, half: the Triton classes on half their default programs, so the slots' tiles keep the other SMs
LABELS = ("triton class", "mosaic slots", "mosaic slots of 2048", "mosaic slots, own stream",
          "mosaic slots, own stream, half programs")
BOUND = 2048


def _variants(chunks: int, chunk: int) -> list[tuple]:
    """(slots, chunk, stream, label) of each variant of a batch of ``chunks`` chunks of ``chunk`` tokens (``LABELS``;
    the third only where the chunks are shorter than ``BOUND``)."""
    return [(0, None, 0, LABELS[0]), (chunks, chunk, 0, LABELS[1]), (chunks, chunk, 1, LABELS[3]),
            (chunks, chunk, 1, LABELS[4])] + ([(chunks, BOUND, 0, LABELS[2])] if chunk < BOUND else [])


def run(out_f, dev, t0, max_seconds, dry=False):
    """``--prefill-slots`` (module docstring): one record per cell and variant into ``out_f``. ``dry``: tiny sizes on
    the CPU, the Triton class only (JAX's GPU interpreter, which runs the slots there, hangs under jit)."""
    import jax
    import jax.numpy as jnp

    from attnlab.core.serving_cost import serving_roofline_s
    from attnlab.kernels.serving_plan import ServingConfig

    shape0 = DRY if dry else FULL
    K, H, s = shape0["K"], shape0["H"], shape0["S_mix"]
    peaks = g.roofline_peaks()
    for page in (None, 16):
        for chunks, chunk, decodes in ((1, 40, 3),) if dry else MIXED:
            q_len, kv = g.mixed_batch(chunks, chunk, decodes, s, np.random.default_rng(3))
            k, v, table, _, _, (tk, tv, _) = _caches(jax.random.PRNGKey(0), dict(shape0, B=len(kv)), s, page, False)
            starts = g.starts_of(q_len)
            T_total = int(starts[-1]) + 64
            for N in (shape0["N"],) if dry else (32, 56):
                shape = dict(shape0, S=s, B=len(kv), N=N)
                q = jax.random.normal(jax.random.PRNGKey(5), (T_total, N, H), jnp.bfloat16)
                a, b = jnp.asarray(starts), jnp.asarray(kv)
                refs = g.references(q, tk, tv, starts, kv, None, requests=(0, chunks - 1))
                roof_ms = serving_roofline_s(starts, kv, N, K, H, 2, **peaks) * 1e3
                for slots, size, stream, label in _variants(chunks, chunk)[:1 if dry else None]:
                    if time.perf_counter() - t0 > max_seconds:
                        return
                    half = _half_programs(K) if label == LABELS[4] else None
                    cfg = ServingConfig(prefill_slots=slots, prefill_chunk=size, prefill_stream=stream, programs=half)
                    plan, step = _step(shape, page, T_total, cfg, None)
                    rec = dict(kind="prefill-slots", device=dev, batch=f"mixed {chunks}x{chunk}+{decodes}", G=N // K,
                               T=1, prefill=label, roofline_ms=roof_ms,
                               lengths_traced=True, layout=f"paged{page}" if page else "contig",
                               **{x: shape[x] for x in "BSNKH"})
                    args = (q, k, v, a, b, table, None, None, plan(a, b))
                    _run(out_f, rec, step, args, refs, roof_ms, dry, kernels=True,
                         keys=("batch", "G", "layout", "prefill"))
                    if rec.get("ms") and not dry:
                        _wall(out_f, rec, step, args)
            del k, v, table, tk, tv


def _half_programs(kv_heads: int) -> int:
    """Half the Triton classes' default programs per KV head (2 per SM over the KV heads: ``serving_plan``)."""
    from attnlab.kernels.decode_resources import sm_count

    return max(1, sm_count() // kv_heads)


def _wall(out_f, rec, step, args):
    """A "prefill-slots-wall" record of ``rec``'s cell: the host clock around 20 calls queued back to back, ms per
    call (the median of 5 rounds): what overlapping kernels take, which CUPTI's sum of kernels cannot show."""
    from attnlab.measure import timers

    ms = timers.wall_pipelined(step, [args], calls=20, rounds=5).median
    wall = {k: x for k, x in rec.items() if k not in ("check", "kernels", "ms", "pct_roofline")}
    wall.update(kind="prefill-slots-wall", timer="host clock, 20 calls queued", ms=ms,
                pct_roofline=100 * rec["roofline_ms"] / ms, cupti_ms=rec["ms"])
    out_f.write(json.dumps(wall) + "\n")
    out_f.flush()


def tables_md(path) -> str:
    """The A/B table (markdown) of the records in ``path``."""
    recs = ab.read(path)
    return "\n".join(ab.ab_table(
        recs, kind="prefill-slots", cell=("batch", "G", "layout"), variant="prefill",
        variants=LABELS[:3], ratios=((0, 1), (0, 2)), error_chars=60,
        title="Mixed serving steps (bf16, lengths traced): ms (% of the combined roofline of the valid work), the "
              "prefill chunks on the Triton prefill class against the Mosaic GPU slots; each call's kernels",
        headers=("batch", "G", "cache", "Triton class", "Mosaic slots", "slots of 2048", "speed-up",
                 "speed-up, slots of 2048", "slots: kernels", "Triton: kernels"), kernels_of=(1, 0)) + [""] + ab.ab_table(
        recs, kind="prefill-slots-wall", cell=("batch", "G", "layout"), variant="prefill",
        variants=(LABELS[0], LABELS[1], LABELS[3], LABELS[4]), ratios=((0, 1), (1, 2), (1, 3)), error_chars=60,
        title="The same steps by the host clock (20 calls queued, ms per call, % of the combined roofline): the slots "
              "before the Triton classes against the slots on their own CUDA stream beside them",
        headers=("batch", "G", "cache", "Triton class", "Mosaic slots", "slots, own stream", "own stream, half",
                 "slots / Triton", "own stream / slots", "half / slots"))) + "\n"
