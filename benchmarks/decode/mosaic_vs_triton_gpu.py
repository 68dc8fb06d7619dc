"""Issue 25 on the H200 (~2-4 min): the Mosaic GPU (wgmma) decode kernel against the Triton one at 64-512 rows.

    PYTHONPATH=src python3 benchmarks/decode/mosaic_vs_triton_gpu.py OUT_DIR [--max-seconds 380] [--plan-only]

B=8, S=32768, H=128, bf16, causal, full lengths: the grid's cells with T*G >= 64, the Triton kernel's
default plan beside ``kernels.decode_mgpu`` with a few (block_kv, max_steps, splits). Each output is
compared with a float32 XLA reference (relative Frobenius error) before CUPTI timing (10 calls, all
kernels of a call summed: q's re-layout and the split combine included). A ragged-lengths case
checks the masked path. Writes OUT_DIR/mgpu.jsonl (one record per variant, as it finishes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

B, S, H = 8, 32768, 128
#: (N, K, T) with T*G >= 64 on issue 25's grid, 64-row cells first for the crossover
CELLS = [(32, 8, 16), (64, 8, 8), (64, 4, 4), (28, 4, 16), (32, 8, 32), (64, 8, 16), (64, 4, 8),
         (28, 4, 32), (32, 8, 64), (64, 8, 32), (64, 4, 16), (28, 4, 64), (64, 8, 64), (64, 4, 32)]
VARIANTS = [{"kernel": "triton"}, {"kernel": "mgpu", "block_kv": 64},
            {"kernel": "mgpu", "block_kv": 64, "stage_out": False},
            {"kernel": "mgpu", "block_kv": 128, "stage_out": False},
            {"kernel": "mgpu", "block_kv": 64, "stage_out": False, "split_x": 2}]


def main(out: str, max_seconds: float, variants=None) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import attnlab
    from attnlab.backends.attnlab_decode import roofline_ms
    from attnlab.kernels import decode as kd
    from attnlab.kernels import decode_mgpu as dm
    from attnlab.measure import timers

    os.makedirs(out, exist_ok=True)
    deadline = time.perf_counter() + max_seconds
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    cases = [(N, K, T, "full") for N, K, T in CELLS] + [(28, 4, 16, "ragged"), (64, 8, 8, "ragged")]
    for N, K, T, kind in cases:
        q, k, v = attnlab.reference.inputs.random_qkv(B, T, S, N, K, H, "bfloat16", seed=T)
        lens = ([S] * B if kind == "full"
                else [int(x) for x in np.random.default_rng(T).integers(T, S + 1, size=B)])
        n = jnp.asarray(lens, jnp.int32)
        with jax.default_matmul_precision("highest"):
            ref = jax.jit(lambda q, k, v, n: attnlab.decode_attention(f32(q), f32(k), f32(v), n,
                                                                       implementation="xla"))(q, k, v, n)
        for var in variants or (VARIANTS if kind == "full" else VARIANTS[:3]):
            if time.perf_counter() > deadline:
                print("out of time", flush=True)
                return
            rec = {"N": N, "K": K, "T": T, "rows": T * N // K, "lengths": kind, "B": B, "S": S, "H": H, **var}
            try:
                if var["kernel"] == "plan":     # what attnlab runs by default: the plan's pick
                    rec["picked"] = dm.pick_kernel(T, S, N, K, H, "bfloat16", compute_capability=(9, 0))
                    fn = jax.jit(lambda q, k, v, n: kd.decode_attention_pallas(q, k, v, n))
                    plan = None
                elif var["kernel"] == "triton":
                    plan = kd.make_plan(B, T, S, N, K, H, "bfloat16", compute_capability=(9, 0))
                    fn = jax.jit(lambda q, k, v, n, plan=plan: kd.decode_attention_pallas(q, k, v, n, plan=plan))
                else:
                    kw = {"block_kv": var["block_kv"], "stage_out": var.get("stage_out", True)}
                    plan = dm.make_mgpu_plan(B, T, S, N, K, H, **kw)
                    if var.get("split_x"):
                        plan = dm.make_mgpu_plan(B, T, S, N, K, H, **kw, num_splits=plan.num_splits * var["split_x"])
                    fn = jax.jit(lambda q, k, v, n, plan=plan: dm.decode_attention_mgpu(q, k, v, n, plan=plan))
                rec["plan"] = dict(plan.__dict__) if plan else None
                t0 = time.perf_counter()
                got = fn(q, k, v, n)
                got.block_until_ready()
                rec["first_call_s"] = round(time.perf_counter() - t0, 2)
                d = f32(got) - ref
                rec["rel_err"] = float(jnp.linalg.norm(d.ravel()) / jnp.linalg.norm(ref.ravel()))
                rec["nan"] = int(jnp.isnan(f32(got)).sum())
                st = timers.kernel_per_call(fn, [(q, k, v, n)], 10)
                rec["ms"], rec["ms_spread"] = st.median, [st.min, st.max]
                rec["pct_roofline"] = 100 * roofline_ms(lens, T, N, K, H, 2) / st.median
            except Exception as e:  # noqa: BLE001 - a variant that fails is a result
                rec["error"] = f"{type(e).__name__}: {str(e)[:600]}"
            print(f"N/K {N}/{K} T{T:>2} rows {rec['rows']:>3} {kind:<6} {json.dumps(var):<58} {rec.get('ms', 0):8.4f} ms "
                  f"{rec.get('pct_roofline', 0):5.1f}% err {rec.get('rel_err', 0):.1e} {rec.get('error', '')[:200]}",
                  flush=True)
            with open(os.path.join(out, "mgpu.jsonl"), "a") as f:
                f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--max-seconds", type=float, default=380)
    ap.add_argument("--plan-only", action="store_true", help="only the default plan (decode_attention_pallas)")
    a = ap.parse_args()
    main(a.out, a.max_seconds, [{"kernel": "plan"}] if a.plan_only else None)
