"""Probe: a serving step's prefill chunks through the Mosaic GPU (wgmma) decode kernel, against the serving
kernel's Triton prefill class on the same chunks.

    PYTHONPATH=src python benchmarks/serving/prefill_mosaic_probe.py OUT

The mixed batches of ``gpu.py`` (2 chunks of 2048 + 126 decodes, 8 chunks of 512 + 248; S=16384, N/K=32/8,
H=128, bf16, lengths as gpu.py draws them, seed 3). For each: the serving step's kernels (CUPTI, one by one: the
prefill class's time), and the chunks alone as a padded decode call, ``decode_attention_mgpu(q (P, C, N, H),
k, v (P, S, K, H), kv_lengths)`` (query t at kv_length - C + t, causal), its time and TFLOP/s over the chunks'
causal pairs (``core.serving_cost.serving_flops``), and its largest error against the serving step's rows of
the same chunks (that step is checked against float64 by ``gpu.py``; this probe only compares the two).
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import numpy as np  # noqa: E402

from benchmarks.serving import batches as g  # noqa: E402,I001


def main(out):
    import jax
    import jax.numpy as jnp

    import attnlab
    from attnlab.core.serving_cost import serving_flops
    from attnlab.kernels.decode_mgpu import decode_attention_mgpu
    from attnlab.kernels.serving_plan import ServingConfig

    os.makedirs(out, exist_ok=True)
    N, K, S = 32, 8, 16384
    rows = []
    for chunks, chunk, decodes in ((2, 2048, 126), (8, 512, 248)):
        q_len, kv = g.mixed_batch(chunks, chunk, decodes, S, np.random.default_rng(3))
        starts = g.starts_of(q_len)
        k, v, _ = g.caches(jax.random.PRNGKey(0), len(kv), S, K, "contig")
        q = jax.random.normal(jax.random.PRNGKey(5), (int(q_len.sum()) + 64, N, g.H), jnp.bfloat16)
        step = jax.jit(lambda q, k, v, a, b: attnlab.serving_attention(q, k, v, a, b, implementation="attnlab-decode"))
        args = (q, k, v, jnp.asarray(starts), jnp.asarray(kv))
        ks = g.kernels_ms(step, args)
        prefill_ms = sum(t for n, t in ks if "prefill" in n)
        flops = serving_flops(g.starts_of(q_len[:chunks]), kv[:chunks], N, g.H)
        qc = q[: chunks * chunk].reshape(chunks, chunk, N, g.H)
        kv_c = jnp.asarray(kv[:chunks])
        mg = jax.jit(lambda q, k, v, n: decode_attention_mgpu(q, k, v, n, causal=True, interpret=False))
        margs = (qc, k[:chunks], v[:chunks], kv_c)
        got = mg(*margs)
        want = step(*args)[: chunks * chunk].reshape(chunks, chunk, N, g.H)
        err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
        mks = g.kernels_ms(mg, margs)
        mg_ms = sum(t for _, t in mks)
        try:        # the whole step with the chunks in Mosaic GPU prefill slots (ServingConfig.prefill_slots)
            cfg = ServingConfig(prefill_slots=chunks, prefill_chunk=chunk)
            slot_step = jax.jit(lambda q, k, v, a, b: attnlab.serving_attention(
                q, k, v, a, b, implementation="attnlab-decode", plan=attnlab.serving_plan(
                    a, b, total_tokens=q.shape[0], kv_len_max=S, heads=N, kv_heads=K, head_dim=g.H, config=cfg)))
            slot_err = float(jnp.max(jnp.abs(slot_step(*args).astype(jnp.float32) - step(*args).astype(jnp.float32))))
            sks = g.kernels_ms(slot_step, args)
            slot = dict(slots_step_ms=sum(t for _, t in sks), slots_kernels=sks, slots_max_abs_diff=slot_err)
        except Exception as e:  # noqa: BLE001 - a probe reports what failed
            slot = dict(slots_error=f"{type(e).__name__}: {str(e)[:400]}")
        r = dict(batch=f"mixed {chunks}x{chunk}+{decodes}", **slot, step_ms=sum(t for _, t in ks), step_kernels=ks,
                 triton_prefill_ms=prefill_ms, triton_prefill_tflops=flops / (prefill_ms * 1e-3) / 1e12,
                 mosaic_ms=mg_ms, mosaic_kernels=mks, mosaic_tflops=flops / (mg_ms * 1e-3) / 1e12,
                 max_abs_diff=err, kv_lengths=[int(x) for x in kv[:chunks]], device=str(jax.devices()[0].device_kind))
        print(json.dumps(r), flush=True)
        rows.append(r)
    with open(os.path.join(out, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main(sys.argv[1])
