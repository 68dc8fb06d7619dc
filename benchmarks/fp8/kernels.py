"""Where an FP8 recipe's time goes: CUPTI time per kernel of one jitted call (issue 15).

    PYTHONPATH=src python3 benchmarks/fp8/kernels.py OUT.json [--iterations 10]
    python3 benchmarks/fp8/kernels.py --table OUT.json        # markdown from the record (no JAX)

For each recipe (per-tensor amax, unit scales, and the three Hadamard rotations) at B=1, T=S in
{4096, 16384}, N=16, H=128, bf16 in, non-causal, gaussian inputs: every kernel the compiled call
launches, with its median CUPTI time over ``--iterations`` calls
(``jax.experimental.mosaic.gpu.profiler.measure(aggregate=False)``), so the cost of the amax
passes, the rotation and the quantisation stand apart from cuDNN's attention kernel. The output is
checked on 64 evenly spaced query rows against NumPy float64 (``rel_err_f64_rows``); the whole
output of every recipe is checked by benchmarks/fp8/recipes.py at these shapes.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

RECIPES = ["cudnn-fp8", "cudnn-fp8-unit", "cudnn-fp8-hadamard", "cudnn-fp8-hadamard-fused", "cudnn-fp8-hadamard-f32"]
SEQS = [4096, 16384]


ATTENTION_HINTS = ("fmha", "cudnn", "sdpa", "flash", "attn", "fprop")


def _short(name: str) -> str:
    low = name.lower()
    return "cudnn fmha (attention)" if any(h in low for h in ATTENTION_HINTS) else name[:60]


CHECK_ROWS = 64


def _rel_err_f64(out, q, k, v) -> float:
    """rel L2 of ``CHECK_ROWS`` evenly spaced query rows of out (1, T, N, H) against NumPy float64
    attention of those rows over every key (non-causal: a row needs only itself)."""
    import numpy as np

    from attnlab.reference.float64 import reference_attention, rel_l2

    rows = np.linspace(0, q.shape[1] - 1, CHECK_ROWS).astype(int)
    f = lambda x: np.asarray(x.astype("float32"), np.float64)  # noqa: E731
    ref = reference_attention(f(q)[:, rows], f(k), f(v))
    return float(rel_l2(f(out)[:, rows], ref))


def measure(out: str, iterations: int = 10) -> dict:
    import jax
    import numpy as np
    from jax.experimental.mosaic.gpu import profiler

    import attnlab
    from attnlab.measure import env as envmod
    from attnlab.reference.distributions import make_qkv

    rows = []
    for T in SEQS:
        q, k, v = (jax.device_put(np.asarray(x)).astype("bfloat16") for x in make_qkv("gaussian", 1, T, T, 16, 16, 128, seed=0))
        for name in RECIPES:
            fn = jax.jit(lambda a, b, c, n=name: attnlab.attention(a, b, c, implementation=n))
            jax.block_until_ready(fn(q, k, v))
            if os.environ.get("FP8_HLO_DIR"):   # the optimised program, to see what XLA fused
                with open(os.path.join(os.environ["FP8_HLO_DIR"], f"{name}-T{T}.hlo.txt"), "w") as f:
                    f.write(fn.lower(q, k, v).compile().as_text())
            _, runs = profiler.measure(fn, aggregate=False, iterations=iterations)(q, k, v)
            per = {}
            for run in runs:
                for i, (kname, ms) in enumerate(run):
                    per.setdefault((i, kname), []).append(ms)
            kernels = [{"kernel": kname, "label": _short(kname), "median_ms": float(np.median(ms))}
                       for (i, kname), ms in sorted(per.items())]
            total = sum(x["median_ms"] for x in kernels)
            err = _rel_err_f64(fn(q, k, v), q, k, v)
            flops = 4 * T * T * 16 * 128
            rows.append({"backend": name, "q_len": T, "kernels": kernels, "total_ms": total,
                         "tflops": flops / total / 1e9, "rel_err_f64_rows": err, "rows_checked": CHECK_ROWS})
            print(f"T={T} {name:<26} {total:8.4f} ms {flops / total / 1e9:6.0f} TFLOP/s rel L2 {100 * err:.2f}% "
                  + ", ".join(f"{x['label'][:28]} {x['median_ms']:.4f}" for x in kernels), flush=True)
    rec = {"timer": "CUPTI per kernel (mosaic.gpu.profiler.measure aggregate=False), median of "
                    f"{iterations} calls", "shape": "B=1 N=16 H=128 bf16 non-causal gaussian",
           "date": time.strftime("%Y-%m-%d"), "git_commit": os.environ.get("ATTNLAB_GIT_COMMIT"),
           "env": envmod.short(envmod.collect()), "rows": rows}
    with open(out, "w") as f:
        json.dump(rec, f, indent=1)
    return rec


def table(rec: dict) -> list[str]:
    lines = [f"Timer: {rec['timer']}; {rec['shape']}.", "",
             "| T | recipe | rel L2 f64 (rows) | total ms | TFLOP/s | attention kernel ms | other kernels (ms each) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rec["rows"]:
        att = [x for x in r["kernels"] if _short(x["kernel"]).startswith("cudnn fmha")]
        rest = [x for x in r["kernels"] if not _short(x["kernel"]).startswith("cudnn fmha")]
        err = r.get("rel_err_f64_rows")
        lines.append(f"| {r['q_len']} | {r['backend']} | {'-' if err is None else f'{100 * err:.2f}%'} | {r['total_ms']:.4f} | {r['tflops']:.0f} | "
                     f"{sum(x['median_ms'] for x in att):.4f} | "
                     + ", ".join(f"`{x['kernel'][:40]}` {x['median_ms']:.4f}" for x in rest) + " |")
    return lines


def main(argv: list[str]) -> None:
    if argv[:1] == ["--table"]:
        with open(argv[1]) as f:
            print("\n".join(table(json.load(f))))
        return
    iterations = int(argv[argv.index("--iterations") + 1]) if "--iterations" in argv else 10
    rec = measure(argv[0], iterations)
    print("\n".join(table(rec)))


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # the repository root
    from benchmarks.results_folder import script_args  # noqa: E402 (after sys.path)

    main(script_args(__doc__))
