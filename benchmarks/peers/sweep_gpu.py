"""Issue 5's side-by-side sweep of every backend on one GPU, on the same inputs and timer.

    PYTHONPATH=src python3 benchmarks/peers/sweep_gpu.py OUT_DIR [part ...]

Parts: fwd (= fwd64 + fwd128: bf16, D64/D128 x T 1k/4k/16k x causal both, 16k tokens), fwd16 (the same in fp16 for
the float16-only Pallas Mosaic kernel, beside cuDNN), train (fwd+bwd at T=4k), decode (T=1,
GQA 32/8, S 4k/32k/128k, attnlab-decode and pallas-paged too), fp8 (T 4k/16k). Records go to OUT_DIR/results.jsonl (resumable).
"""
import json
import sys

from attnlab.measure import Options
from attnlab.sweep import Sweep, run_sweep

ALL_JAX = ["xla", "cudnn", "te", "tokamax-mosaic", "tokamax-triton", "tokamax-xla", "pallas-triton"]
TORCH = ["torch-flash", "torch-cudnn", "torch-efficient"]
PARTS = {
    "fwd": Sweep(ALL_JAX + TORCH, q_len=[1024, 4096, 16384], heads=[16], head_dim=[64, 128], dtype=["bfloat16"],
                 causal=[False, True], tokens=16384, name="fwd"),
    "fwd16": Sweep(["pallas-mosaic", "cudnn"], q_len=[1024, 4096, 16384], heads=[16], head_dim=[64, 128],
                   dtype=["float16"], causal=[False, True], tokens=16384, name="fwd16"),
    "train": Sweep(["xla", "cudnn", "te", "tokamax-mosaic", "tokamax-triton", "pallas-triton"], q_len=[4096], heads=[16],
                   head_dim=[128], dtype=["bfloat16"], causal=[False, True], mode=["fwd+bwd"], tokens=16384, name="train"),
    "decode": Sweep(["xla", "cudnn", "te", "tokamax-mosaic", "tokamax-triton", "attnlab-decode", "pallas-paged"] + TORCH,
                    batch=[8], q_len=[1],
                    kv_len=[4096, 32768, 131072], heads=[32], kv_heads=[8], head_dim=[128], dtype=["bfloat16"], name="decode"),
    "fp8": Sweep(["cudnn", "cudnn-fp8", "cudnn-fp8-unit", "te", "te-fp8"], q_len=[4096, 16384], heads=[16], head_dim=[128],
                 dtype=["bfloat16"], causal=[False, True], tokens=16384, name="fp8"),
}


# the forward part split by head dim (same sweep name, so tables treat it as one part)
for _h in (64, 128):
    PARTS[f"fwd{_h}"] = Sweep(ALL_JAX + TORCH, q_len=[1024, 4096, 16384], heads=[16], head_dim=[_h], dtype=["bfloat16"],
                              causal=[False, True], tokens=16384, name="fwd")


def main(out, parts, only=None):
    opts = Options(repeats=10, compile_budget_s=120)
    for p in parts:
        sweep = PARTS[p]
        if only:
            sweep.backends = [b for b in sweep.backends if b in only]
            if not sweep.backends:
                continue
        recs = run_sweep(sweep, out, resume=True, options=opts,
                         on_cell=lambda c, r, i, n: r and print(f"[{p} {i + 1}/{n}] {c.backend:<15} {c.config_label:<48} "
                                                                 f"{r['status']:<12} {r['kernel_ms'] or 0:9.4f} ms "
                                                                 f"{r['tflops'] or 0:7.1f} TF/s {(r['reason'] or '')[:60]}", flush=True))
        print(json.dumps({"part": p, "cells": len(recs), "ok": sum(r["status"] == "ok" for r in recs)}))


if __name__ == "__main__":
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # the repository root
    from benchmarks.results_folder import script_args  # noqa: E402 (after sys.path)

    out, *args = script_args(__doc__)
    only = None
    if args and args[0].startswith("--only="):
        only = set(args.pop(0).split("=", 1)[1].split(","))
    main(out, args or ["fwd", "fwd16", "train", "decode", "fp8"], only)
