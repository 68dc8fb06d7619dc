"""Tune attnlab's decode kernel on the GPU: CUPTI time of each tuning variant, checked, beside cuDNN.

    PYTHONPATH=src python3 benchmarks/decode/tune.py OUT_DIR [--budget-s 210] [--repeats 20] [--quick] [--smoke]

Shapes (bf16, causal decode rule, uniform lengths unless named): the issue's goal shape B=8,
S=32768, N=32, K=8, H=128 at T = 1, 2, 4, 8, 16, 32, 64; B=1, S=131072 and B=32, S=4096 at
T = 1, 4, 16; and B=8, S=32768, T=4 with ragged lengths (GB/s on the bytes held).

Phase 1, for every shape: the default variant, cuDNN (``attention(..., key_value_seq_lengths)``,
non-causal: at T = 1 the same rule; at T > 1 also ``decode_attention(causal=True,
implementation="cudnn")``, a dense mask), and at T = 1 JAX's Pallas ``paged_attention`` (pages
made outside the timed call). Phase 2, while the time budget lasts: a small grid of block_k x
num_stages, then num_warps and half / double the split count, per shape in that order.
Each variant is checked against a float32 reference computed on the device (rel L2 <= 1e-2;
bf16 output rounding alone is ~3e-3) and a failure (compile, launch, wrong result) is recorded
for that variant only. Timing: ``attnlab.measure.timers.kernel_per_call`` (CUPTI, every kernel of
the call: q re-layout, the Pallas kernel, the combine). The caches are >= 268 MB, well past the
60 MB L2, so one input set suffices (smaller caches rotate several sets).

Writes OUT_DIR/decode_tune.json after every shape (and a log line per variant to stdout);
prints the best parameters per shape and how each goal of issue 13 stands.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

from attnlab import Problem  # noqa: E402
from attnlab.sweep.decode_tune import (HBM_TBS, L2_BYTES, PEAK_TFLOPS, SMEM_LIMIT, goal_lines, label, lengths,  # noqa: E402,F401
                                        shape_record, sizes, shapes, tune_grid)


def _time(fn, args, repeats):
    from attnlab.measure import timers

    compiled, lower_s, compile_s = timers.compile_seconds(fn, args[0])
    timers.warm_up(compiled, args)
    if timers.kernel_timer_available() is None:
        st = timers.kernel_per_call(compiled, args, repeats)
    else:   # --smoke on a CPU: wall clock
        st = timers.wall_per_call(compiled, args, repeats)
    return compiled, st, lower_s + compile_s


def run(out_dir: str, budget_s: float, repeats: int, quick: bool, smoke: bool = False) -> dict:
    import jax
    import jax.numpy as jnp

    import attnlab
    import attnlab.core.device
    import attnlab.reference.inputs
    from attnlab.backends import pallas_paged
    from attnlab.kernels import decode as kd

    t_start = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    dev = jax.devices()[0]
    cc = attnlab.core.device.current().compute_capability
    sms = kd.sm_count()
    interpret = jax.default_backend() != "gpu"
    report = {"device": dev.device_kind, "jax": jax.__version__, "sm_count": sms, "compute_capability": cc,
              "repeats": repeats, "budget_s": budget_s, "timer": "cupti" if jax.default_backend() == "gpu" else "wall (smoke)",
              "shapes": [], "skipped": []}
    path = os.path.join(out_dir, "decode_tune.json")

    def save():
        report["elapsed_s"] = time.perf_counter() - t_start
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)

    state = {}   # shape name -> (inputs, reference, record)

    def inputs(sh: Problem):
        q, k, v = attnlab.reference.inputs.random_qkv(*sizes(sh), sh.dtype, seed=sh.q_len)
        kv_lens = jnp.asarray(lengths(sh), jnp.int32)
        nbytes = 2 * sum(lengths(sh)) * sh.kv_heads * sh.head_dim * 2
        sets = max(1, min(3, math.ceil(4 * L2_BYTES / nbytes)))
        arg_sets = [(q, k, v, kv_lens)]
        for i in range(1, sets):
            qi, ki, vi = attnlab.reference.inputs.random_qkv(*sizes(sh), sh.dtype, seed=100 + i)
            arg_sets.append((qi, ki, vi, kv_lens))
        return arg_sets, nbytes

    def reference(q, k, v, lengths, sh: Problem):
        f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
        with jax.default_matmul_precision("highest"):
            return jax.jit(lambda q, k, v, n: attnlab.decode_attention(f32(q), f32(k), f32(v), n, causal=True,
                                                                        implementation="xla"))(q, k, v, lengths)

    def rel_err(out, ref):
        d = out.astype(jnp.float32) - ref
        return float(jnp.linalg.norm(d.ravel()) / jnp.linalg.norm(ref.ravel()))

    def variant(sh: Problem, cfg: dict, tag: str):
        arg_sets, ref, rec = state[label(sh)]
        v = {"tag": tag, "config": cfg}
        try:
            plan = kd.make_plan(*sizes(sh), sh.dtype, kd.DecodeConfig(**cfg), sms=sms,
                                compute_capability=cc)
            v["plan"] = dataclasses.asdict(plan)
            fn = lambda q, k, vv, n: kd.decode_attention_pallas(q, k, vv, n, causal=True, plan=plan,  # noqa: E731
                                                                 interpret=interpret)
            compiled, st, comp_s = _time(fn, arg_sets, repeats)
            err = rel_err(compiled(*arg_sets[0]), ref)
            v.update(ms=st.median, ms_min=st.min, ms_iqr=st.iqr, compile_s=comp_s, rel_err=err, ok=err <= 1e-2,
                     gbps=rec["kv_bytes"] / (st.median * 1e-3) / 1e9)
            v["pct_hbm"] = 100 * v["gbps"] / (HBM_TBS * 1e3)
            v["pct_roofline"] = 100 * rec["roofline_ms"] / st.median
        except Exception as e:  # noqa: BLE001 - one bad variant must not stop the run
            v.update(ok=False, error=f"{type(e).__name__}: {str(e)[:400]}", trace=traceback.format_exc()[-1500:])
        rec["variants"].append(v)
        good = [x for x in rec["variants"] if x.get("ok")]
        rec["best"] = min(good, key=lambda x: x["ms"]) if good else None
        ms = f"{v['ms']:.4f} ms {v['gbps']:7.0f} GB/s {v['pct_roofline']:5.1f}% roof err {v['rel_err']:.1e}" if "ms" in v \
            else v.get("error", "")[:120]
        print(f"[{time.perf_counter() - t_start:6.1f}s] {label(sh):<34} {tag:<8} {json.dumps(cfg):<42} {ms}", flush=True)

    def peers(sh: Problem):
        arg_sets, ref, rec = state[label(sh)]
        q, k, v, n = arg_sets[0]
        calls = {"cudnn_kvlen": lambda q, k, v, n: attnlab.attention(q, k, v, key_value_seq_lengths=n, implementation="cudnn")}
        if sh.q_len > 1:
            calls["cudnn_causal"] = lambda q, k, v, n: attnlab.decode_attention(q, k, v, n, causal=True, implementation="cudnn")
        for name, fn in calls.items():
            try:
                compiled, st, _ = _time(fn, arg_sets, repeats)
                rec[f"{name}_ms"] = st.median
                if name == "cudnn_causal" or sh.q_len == 1:
                    rec[f"{name}_rel_err"] = rel_err(compiled(*arg_sets[0]), ref)
            except Exception as e:  # noqa: BLE001
                rec[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        if sh.q_len == 1 and sh.kv_len % pallas_paged.PAGE_SIZE == 0:
            try:
                kp, vp, tables = jax.jit(pallas_paged.to_pages)(k, v)
                splits, per_block = pallas_paged.launch_params(sh.kv_len)
                fn = lambda q, kp, vp, t, n: pallas_paged.paged_call(q, kp, vp, t, n, scale=1 / math.sqrt(sh.head_dim),  # noqa: E731
                                                                     k_splits=splits, pages_per_block=per_block)
                compiled, st, _ = _time(fn, [(q, kp, vp, tables, n)], repeats)
                rec["paged_ms"] = st.median
                rec["paged_rel_err"] = rel_err(compiled(q, kp, vp, tables, n), ref)
                del kp, vp
            except Exception as e:  # noqa: BLE001
                rec["paged_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(f"[{time.perf_counter() - t_start:6.1f}s] {label(sh):<34} peers    "
              + " ".join(f"{k}={rec[k]:.4f}" for k in ("cudnn_kvlen_ms", "cudnn_causal_ms", "paged_ms") if k in rec)
              + " " + " ".join(f"{k}={rec[k][:80]}" for k in rec if k.endswith("_error")), flush=True)

    def setup(sh: Problem):
        arg_sets, nbytes = inputs(sh)
        q, k, v, n = arg_sets[0]
        flops = 4.0 * sh.q_len * sh.heads * sh.head_dim * sum(lengths(sh))
        rec = {"shape": shape_record(sh), "label": label(sh), "lengths": lengths(sh), "kv_bytes": nbytes,
               "flops": flops, "input_sets": len(arg_sets),
               "roofline_ms": max(nbytes / (HBM_TBS * 1e12), flops / (PEAK_TFLOPS * 1e12)) * 1e3, "variants": []}
        state[label(sh)] = (arg_sets, reference(q, k, v, n, sh), rec)
        report["shapes"].append(rec)

    def release(sh: Problem):
        state.pop(label(sh), None)

    all_shapes = shapes(quick, smoke)
    # Phase 1: defaults and peers for every shape.
    for sh in all_shapes:
        try:
            setup(sh)
            variant(sh, {}, "default")
            peers(sh)
        except Exception as e:  # noqa: BLE001
            report["skipped"].append({"label": label(sh), "error": f"{type(e).__name__}: {e}",
                                      "trace": traceback.format_exc()[-1500:]})
            release(sh)
        save()
    # Phase 2: the grid, shape by shape, while the budget lasts (inputs stay on the device: ~10 GB).
    for sh in all_shapes:
        if label(sh) not in state:
            continue
        rec = state[label(sh)][2]
        if not rec["variants"] or "plan" not in rec["variants"][0]:
            continue
        if time.perf_counter() - t_start > budget_s:
            report["skipped"].append({"label": label(sh), "error": "time budget spent: grid not run"})
            continue
        default_plan = kd.Plan(**rec["variants"][0]["plan"])
        grid = tune_grid(sh, default_plan)
        if sh.kv_lengths is not None:
            goal4 = next((r for r in report["shapes"] if r["shape"]["name"] == "goal" and r["shape"]["T"] == sh.q_len
                          and not r["shape"]["ragged"] and r["shape"]["S"] == sh.kv_len), None)
            best = goal4 and goal4.get("best")
            grid = [best["config"]] if best and best["config"] else []
        for cfg in grid:
            if time.perf_counter() - t_start > budget_s:
                report["skipped"].append({"label": label(sh), "config": cfg, "error": "time budget spent"})
                continue
            variant(sh, cfg, "grid")
        release(sh)
        save()
    save()
    return report


def print_table(report: dict) -> None:
    print(f"\n{report['device']}  jax {report['jax']}  SMs {report['sm_count']}  elapsed {report.get('elapsed_s', 0):.0f} s")
    hdr = f"{'shape':<34} {'best ms':>8} {'GB/s':>6} {'%HBM':>5} {'%roof':>5} {'cudnn':>7} {'cud/caus':>8} {'paged':>7}  best parameters"
    print(hdr)
    print("-" * len(hdr))
    for r in report["shapes"]:
        b = r.get("best")
        f = lambda k: f"{r[k]:.4f}" if k in r else "-"  # noqa: E731
        if b:
            p = b["plan"]
            params = (f"block_k={p['block_k']} block_r={p['block_r']} warps={p['num_warps']} stages={p['num_stages']} "
                      f"splits={p['num_splits']} ({len(r['variants'])} tried)")
            print(f"{r['label']:<34} {b['ms']:8.4f} {b['gbps']:6.0f} {b['pct_hbm']:5.1f} {b['pct_roofline']:5.1f} "
                  f"{f('cudnn_kvlen_ms'):>7} {f('cudnn_causal_ms'):>8} {f('paged_ms'):>7}  {params}")
        else:
            errs = [v.get("error", "") for v in r["variants"]]
            print(f"{r['label']:<34} no correct variant: {errs[:1]}")
    print("\nGoals (issue 13, B=8 S=32768 GQA 32/8 H=128 bf16):")
    for line in goal_lines(report):
        print("  " + line)
    for s in report["skipped"][:10]:
        print(f"  skipped: {s.get('label')} {s.get('config', '')} {s['error'][:200]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--budget-s", type=float, default=210.0, help="stop starting grid variants after this many seconds")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="three goal shapes only (T = 1, 4, 64)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, to try the script on a CPU")
    a = ap.parse_args(argv)
    report = run(a.out_dir, a.budget_s, a.repeats, a.quick, a.smoke)
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
