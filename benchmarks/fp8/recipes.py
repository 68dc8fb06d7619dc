"""Issue 15's FP8 study: every cuDNN FP8 recipe against bf16 cuDNN, error vs float64 against speed.

    PYTHONPATH=src python3 benchmarks/fp8/recipes.py OUT [--max-seconds 390]     # measure (resumable)
    python3 benchmarks/fp8/recipes.py --table OUT/results.jsonl [--plot P.png]   # table, goals, plot

The grid, its order, how FP8 cells are judged and what the columns mean are described in
``attnlab.report.fp8_recipes``.

Goals (issue 15, item 4), evaluated by ``goals``: gaussian, T=16k non-causal: some FP8 recipe at
<= 3% rel L2 and >= 1000 TFLOP/s; outliers and channel-outliers: the best recipe among those at most
5% slower than ``cudnn-fp8`` (per-tensor amax) has >= 2.5x lower error than it.

The grid, table, goals and plot live in attnlab.report.fp8_recipes (records only, no JAX).
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

from attnlab.report.fp8_recipes import BACKENDS, INPUTS, SHAPES, report  # noqa: E402

DEFAULT_MAX_SECONDS = 390.0


class _OutOfTime(Exception):
    pass


def sweeps():
    """One Sweep per (T, causal, inputs), in measuring order."""
    from attnlab.sweep import Sweep

    return [Sweep(BACKENDS, batch=[1], q_len=[T], heads=[16], head_dim=[128], dtype=["bfloat16"], causal=[c],
                  inputs=[d], mode=["fwd"], name=f"fp8-T{T}{'-causal' if c else ''}")
            for T, c in SHAPES for d in INPUTS]


def measure(out: str, max_seconds: float = DEFAULT_MAX_SECONDS) -> None:
    from attnlab.measure import Options
    from attnlab.core.store import read_records
    from attnlab.sweep import run_sweep
    from attnlab.sweep.engine import CSV_COLUMNS, write_csv

    opts = Options(repeats=20, compile_budget_s=60)
    t0 = time.perf_counter()
    n_cells = 0

    def show(c, r, i, n):
        if r:
            print(f"[{time.perf_counter() - t0:6.1f}s] {c.backend:<27} {c.inputs:<17} T{c.q_len} "
                  f"{'causal' if c.causal else 'full  '} {r['status']:<12} {r.get('kernel_ms') or 0:8.4f} ms "
                  f"{r.get('tflops') or 0:7.1f} TFLOP/s rel L2 f64 {100 * (r.get('rel_err_f64') or 0):6.2f}% "
                  f"{(r['reason'] or '')[:60]}", flush=True)
        if time.perf_counter() - t0 > max_seconds:
            raise _OutOfTime

    try:
        for sw in sweeps():
            if time.perf_counter() - t0 > max_seconds:
                raise _OutOfTime
            n_cells += len(run_sweep(sw, out, resume=True, options=opts, on_cell=show))
    except _OutOfTime:
        path = os.path.join(out, "results.jsonl")
        write_csv(read_records(path), os.path.join(out, "results.csv"), CSV_COLUMNS)
        print(json.dumps({"stopped": f"--max-seconds {max_seconds:g} reached; rerun to resume"}), flush=True)
    print(json.dumps({"out": out, "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--table":
        plot_path = argv[argv.index("--plot") + 1] if "--plot" in argv else None
        print(report(argv[1], plot_path))
        return
    max_s = float(argv[argv.index("--max-seconds") + 1]) if "--max-seconds" in argv else DEFAULT_MAX_SECONDS
    measure(argv[0], max_s)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # the repository root
    from benchmarks.results_folder import script_args  # noqa: E402 (after sys.path)

    main(script_args(__doc__))
