"""Packed sequences on the H200: cuDNN's packed path against unpacked cuDNN, a dense segment mask on
cuDNN, tokamax and XLA, at the same total tokens; forward and fwd+bwd; every variant checked first.

    python benchmarks/prefill/packed_cudnn.py --seq 4096,16384 --docs 4 --out DIR

Writes DIR/packed.jsonl (one row per variant, T, mode: ms (CUPTI kernel time), the check's errors,
or the error; ``flops``, ``tflops`` and ``pct_peak``: the pairs the call computes, counted by
``attnlab.Problem``: within each document for the packed and masked variants, every causal pair for
unpacked) and prints a table. The GQA probe calls JAX's packed entry point directly with K < N
(attnlab refuses it) to show whether JAX's key offsets are strided right.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import attnlab
import attnlab.reference.inputs
from attnlab import Problem
from attnlab.core.workload import with_segment_ids
from attnlab.core import segments
from attnlab.measure import check, peaks, timers
from attnlab.reference.compiled import clear_results


def variants(ids, mask):
    seg = dict(query_segment_ids=ids, key_value_segment_ids=ids)
    return {
        "cudnn unpacked": dict(implementation="cudnn"),
        "cudnn packed": dict(implementation="cudnn", **seg),
        "cudnn dense mask": dict(implementation="cudnn", mask=mask),
        "tokamax-triton packed (mask)": dict(implementation="tokamax-triton", **seg),
        "xla packed (mask)": dict(implementation="xla", **seg),
    }


def measure(name, kw, q, k, v, ct, mode, sem, key, repeats):
    row = {"variant": name, "T": int(q.shape[1]), "B": int(q.shape[0]), "mode": mode}
    fwd = lambda q, k, v: attnlab.attention(q, k, v, is_causal=True, **kw)  # noqa: E731
    try:
        out = jax.jit(fwd)(q, k, v)
        chk = check.check_forward(out, q, k, v, sem, ref_key=key)
        row.update(ok=chk["ok"], rel_err=chk["rel_err"], rel_err_f64=chk["rel_err_f64"], reason=chk["reason"])
        if mode == "fwd":
            fn, args = fwd, (q, k, v)
        else:
            fn = jax.grad(lambda q, k, v, ct: jnp.sum(fwd(q, k, v).astype(jnp.float32) * ct), argnums=(0, 1, 2))
            args = (q, k, v, ct)
            g = jax.jit(fn)(*args)
            gc = check.check_grads(g, q, k, v, ct, sem, ref_key=key)
            row.update(grad_ok=gc["grad_check"] == "ok", grad_rel_err=gc["grad_rel_err"], grad_reason=gc["grad_reason"])
        compiled, _, _ = timers.compile_seconds(fn, args)
        timers.warm_up(compiled, [args], 2)
        try:
            row["ms"], row["timer"] = timers.kernel_per_call(compiled, [args], repeats).median, "cupti"
        except Exception:  # noqa: BLE001 - no CUPTI here: the host clock, said so
            row["ms"], row["timer"] = timers.wall_per_call(compiled, [args], repeats).median, "wall"
        rate(row, q, sem.segment_ids, mode)
    except Exception as e:  # noqa: BLE001 - a variant that fails is reported, the run goes on
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return row


def rate(row, q, ids, mode):
    """``flops`` of the pairs the call computes (packed or masked: within documents), ``tflops`` at ``ms``
    and ``pct_peak`` of the device's datasheet bf16 peak."""
    B, T, N, H = (int(d) for d in q.shape)
    prob = Problem(B, T, T, N, N, H, "bfloat16", True)
    w = with_segment_ids(prob, ids) if ids is not None else prob
    row["flops"] = w.flops(mode)
    row["tflops"] = row["flops"] / (row["ms"] * 1e-3) / 1e12
    pk = peaks.peak_tflops(jax.devices()[0].device_kind, "bfloat16")
    row["pct_peak"] = 100 * row["tflops"] / pk if pk else None


def gqa_probe(T=2048):
    """JAX's packed entry point with K < N, called directly: is the output right?"""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    from attnlab.backends import cudnn_packed
    from attnlab.reference.float64 import rel_l2, reference_attention

    q, k, v = attnlab.reference.inputs.random_qkv(1, T, T, 8, 2, 128, "bfloat16", seed=5)
    ids = jnp.asarray(segments.docs(1, T, 4, seed=1))
    off, lens, _, _ = cudnn_packed.layout(ids, 4)
    try:
        out = jax.jit(lambda q, k, v: fa.dot_product_attention(q, k, v, None, None, lens, lens, off, off,
                                                               scale=128 ** -0.5, mask_type=fa.MaskType.CAUSAL))(q, k, v)
        ref = reference_attention(q, k, v, is_causal=True, query_segment_ids=ids, key_value_segment_ids=ids)
        return {"variant": "gqa probe (K=2 < N=8, direct call)", "T": T, "rel_err_f64": rel_l2(out, ref)}
    except Exception as e:  # noqa: BLE001
        return {"variant": "gqa probe", "error": f"{type(e).__name__}: {str(e)[:300]}"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", default="4096,16384")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--modes", default="fwd,fwd+bwd")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--skip", default="", help="comma-separated variant names to leave out")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "packed.jsonl")
    rows = [gqa_probe()]
    print(json.dumps(rows[0]), flush=True)
    for T in (int(x) for x in a.seq.split(",")):
        q, k, v = attnlab.reference.inputs.random_qkv(a.batch, T, T, a.heads, a.heads, a.head_dim, "bfloat16", seed=0)
        ct = jax.random.normal(jax.random.key(7), q.shape, jnp.float32).astype(q.dtype)
        ids_np = segments.docs(a.batch, T, a.docs, seed=11)
        ids = jnp.asarray(ids_np)
        mask = segments.visible(ids, ids)
        for name, kw in variants(ids_np, mask).items():
            if name in a.skip.split(","):
                continue
            packed = "unpacked" not in name
            sem = check.Semantics(causal=True, segment_ids=ids_np if packed else None)
            key = f"T{T} packed={packed}"
            for mode in a.modes.split(","):
                t0 = time.time()
                row = measure(name, kw, q, k, v, ct, mode, sem, key, a.repeats)
                row["docs"] = a.docs if packed else None
                row["wall_s"] = round(time.time() - t0, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(path, "a") as f:
                    f.write(json.dumps(row) + "\n")
        clear_results()
    with open(path, "a") as f:
        f.write(json.dumps(rows[0]) + "\n")


if __name__ == "__main__":
    main()
