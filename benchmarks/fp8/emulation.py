"""FP8 attention error in emulation (issue 15): which tensor's e4m3 rounding costs what, and which recipe helps.

What is emulated (which tensors are rounded, the recipes, the anchor) is described in
``attnlab.reference.fp8_emulation``, where the logic lives; this script measures and writes tables.

    PYTHONPATH=src python benchmarks/fp8/emulation.py --out results/cpu-2026-12-03-fp8-emulation
    PYTHONPATH=src python benchmarks/fp8/emulation.py --out results/cpu-2026-12-03-fp8-emulation \
        --T 4096 --N 1 --causal no --name results-T4096
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src"))

from attnlab.reference.fp8_emulation import COLUMNS, RECIPES, TENSORS, fp8_attention, reference, rel_l2, table  # noqa: E402


def versions() -> dict:
    import jax
    import scipy
    return {"python": sys.version.split()[0], "numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__,
            "jax": jax.__version__, "scipy": scipy.__version__}


def run(out_dir: str, T_list=(1024,), B=1, N=4, H=128, seed=0, recipes=None, dists=None,
        causals=(False, True), name="results.jsonl") -> list[dict]:
    from attnlab.reference.distributions import DISTRIBUTIONS, make_qkv
    from attnlab.reference.float64 import reference_attention
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        for T in T_list:
            for dist in dists or DISTRIBUTIONS:
                q, k, v = make_qkv(dist, B, T, T, N, N, H, "float32", seed)
                for causal in causals:
                    t0 = time.perf_counter()
                    ref = reference(q, k, v, causal)
                    bf16 = rel_l2(reference_attention(q, k, v, is_causal=causal, emulate="bfloat16"), ref)
                    base = dict(T=T, S=T, B=B, N=N, H=H, dist=dist, causal=causal, seed=seed)
                    rows.append(dict(base, recipe="bf16-emulation", quantized="all", rel_l2=bf16))
                    f.write(json.dumps(rows[-1]) + "\n")
                    for recipe in recipes or RECIPES:
                        for col in COLUMNS:
                            qz = {"all": TENSORS, "qkvP": ("q", "k", "v", "P")}.get(col, (col,))
                            err = rel_l2(fp8_attention(q, k, v, is_causal=causal, quantize=qz, recipe=recipe,
                                                       seed=seed), ref)
                            rows.append(dict(base, recipe=recipe, quantized=col, rel_l2=err))
                            f.write(json.dumps(rows[-1]) + "\n")
                    f.flush()
                    print(f"T={T} {dist:17s} causal={causal!s:5s} {time.perf_counter() - t0:6.1f}s", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/cpu-2026-12-03-fp8-emulation")
    ap.add_argument("--T", type=int, nargs="+", default=[1024])
    ap.add_argument("--N", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--name", default="results", help="file stem: NAME.jsonl and NAME.md")
    ap.add_argument("--render", action="store_true", help="only rewrite NAME.md from an existing NAME.jsonl")
    a = ap.parse_args(argv)
    if a.render:
        with open(os.path.join(a.out, a.name + ".jsonl")) as f:
            md = table([json.loads(line) for line in f])
        with open(os.path.join(a.out, a.name + ".md"), "w") as f:
            f.write(md)
        return
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[a.causal]
    rows = run(a.out, tuple(a.T), N=a.N, seed=a.seed, causals=causals, name=a.name + ".jsonl")
    md = table(rows)
    with open(os.path.join(a.out, a.name + ".md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out, "versions.json"), "w") as f:
        json.dump(versions(), f, indent=1)
    print(md)


if __name__ == "__main__":
    main()
