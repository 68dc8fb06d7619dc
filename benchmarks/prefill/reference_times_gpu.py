"""Issue 3's GPU evidence: reproduce reference kernel times, and kernel vs wall at the codelab shape.

    PYTHONPATH=src python3 benchmarks/prefill/reference_times_gpu.py OUT_DIR

Writes OUT_DIR/results.jsonl and .csv (engine records), OUT_DIR/targets.json (measured vs the
reference times taken on an H200 on 2026-12-02), and prints a table.
"""
import json
import sys

from attnlab.measure import Options, peaks
from attnlab.sweep import Sweep, run_sweep

# (label, sweep, reference kernel ms)
TARGETS = [
    ("cuDNN bf16 fwd B1 T=S=16384 N16 H128", Sweep(["cudnn"], [1], [16384], None, [16], None, [128], ["bfloat16"], [False]), 3.15),
    ("cuDNN bf16 fwd B1 T=S=16384 N16 H128 causal", Sweep(["cudnn"], [1], [16384], None, [16], None, [128], ["bfloat16"], [True]), 1.71),
    ("XLA bf16 fwd B1 T=S=16384 N16 H128", Sweep(["xla"], [1], [16384], None, [16], None, [128], ["bfloat16"], [False]), 21.2),
    ("cuDNN decode B8 T1 S32768 N32 K8 H128", Sweep(["cudnn"], [8], [1], [32768], [32], [8], [128], ["bfloat16"], [False]), 0.24),
]
CODELAB = [  # the codelab's timing step at its default shape B=4, T=128, N=8, H=64
    Sweep(["naive", "xla"], [4], [128], None, [8], None, [64], ["float32"], [False], name="codelab"),
    Sweep(["xla", "cudnn"], [4], [128], None, [8], None, [64], ["bfloat16"], [False], name="codelab"),
]


def main(out):
    ceil = peaks.load_ceilings()
    if ceil is None:
        ceil = peaks.measure_ceilings()
        peaks.save_ceilings(ceil)
    opts = Options(repeats=50)
    rows = []
    for label, sweep, ref in TARGETS:
        sweep.name = "targets"
        rec = run_sweep(sweep, out, resume=True, options=opts)[0]
        ms = rec.get("kernel_ms")
        dev = None if ms is None else 100 * (ms - ref) / ref
        rows.append({"label": label, "reference_ms": ref, "kernel_ms": ms, "deviation_pct": dev,
                     "within_5pct": dev is not None and abs(dev) <= 5, "status": rec["status"], "reason": rec["reason"],
                     "tflops": rec.get("tflops"), "pct_peak": rec.get("pct_peak"), "rel_err": rec.get("rel_err")})
    codelab = []
    for sweep in CODELAB:
        for rec in run_sweep(sweep, out, resume=True, options=Options(repeats=100)):
            codelab.append({k: rec.get(k) for k in ("backend", "dtype", "status", "kernel_ms", "wall_ms", "pipelined_ms",
                                                       "dispatch_ms", "compile_s", "rel_err")})
    with open(f"{out}/targets.json", "w") as f:
        json.dump({"ceilings": ceil, "targets": rows, "codelab_default_shape": codelab}, f, indent=2)
    print(f"ceilings: {ceil['matmul_tflops']:.0f} TFLOP/s bf16 matmul, {ceil['copy_gbps']:.0f} GB/s copy")
    for r in rows:
        print(f"{r['label']:<46} ref {r['reference_ms']:>6} ms  got {r['kernel_ms'] or float('nan'):>8.3f} ms  "
              f"{(r['deviation_pct'] or float('nan')):+6.1f}%  {'OK' if r['within_5pct'] else 'MISS'}  {r['status']}")
    for c in codelab:
        print(f"codelab {c['backend']:<6} {c['dtype']:<9} kernel {c['kernel_ms'] or float('nan'):.4f} ms  wall {c['wall_ms'] or float('nan'):.4f} ms  "
              f"pipelined {c['pipelined_ms'] or float('nan'):.4f} ms  {c['status']}")


if __name__ == "__main__":
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # the repository root
    from benchmarks.results_folder import script_args  # noqa: E402 (after sys.path)

    main((script_args(__doc__, 0) or ["issue3-out"])[0])
