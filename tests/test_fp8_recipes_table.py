"""attnlab.report.fp8_recipes (benchmarks/fp8/recipes.py --table): table, goals and plot on canned records
(no JAX, no GPU)."""
import json
import os
import subprocess
import sys

from attnlab.report import fp8_recipes as mod


def _rec(backend, inputs, T, causal, err, ms, status="ok", tflops=None):
    flops = 4 * 16 * T * T * 128 / (2 if causal else 1)
    return {"backend": backend, "inputs": inputs, "batch": 1, "q_len": T, "kv_len": T, "heads": 16, "kv_heads": 16,
            "head_dim": 128, "dtype": "bfloat16", "causal": causal, "mode": "fwd", "status": status,
            "kernel_ms": ms if status == "ok" else None, "timer": "cupti", "rel_err_f64": err, "rel_err": err,
            "tflops": (tflops or flops / ms / 1e9) if status == "ok" else None,
            "reason": None if status == "ok" else "output wrong"}


def _canned(tmp_path):
    T = 16384
    recs = [_rec("cudnn", "gaussian", T, False, 0.0025, 3.2),
            _rec("cudnn-fp8", "gaussian", T, False, 0.055, 2.38),
            _rec("cudnn-fp8-hadamard", "gaussian", T, False, 0.054, 2.45),
            _rec("cudnn-fp8", "outliers", T, False, 0.09, 2.38),
            _rec("cudnn-fp8-hadamard", "outliers", T, False, 0.058, 2.45),     # 1.55x: missed
            _rec("cudnn-fp8-smoothk", "outliers", T, False, 0.02, 2.60),       # 2.60 > 1.05 x 2.38: too slow
            _rec("cudnn-fp8", "channel-outliers", T, False, 0.36, 0, status="incorrect"),
            _rec("cudnn-fp8-hadamard", "channel-outliers", T, False, 0.09, 2.45),   # amax untimed: 4x, met
            _rec("cudnn-fp8-pow2", "gaussian", 4096, True, 0.05, 0.3)]
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n{torn")
    return path


def test_table_goals_and_plot(tmp_path):
    path = _canned(tmp_path)
    recs = mod.load(str(path))
    assert len(recs) == 9
    lines = mod.table(recs)
    head = next(x for x in lines if x.startswith("| inputs"))
    assert "| cudnn | cudnn-fp8 | pow2 |" in head and "hadamard |" in head
    row = next(x for x in lines if x.startswith("| gaussian | 16384 | no"))
    assert "5.50% · 924" in row and "0.25% · 687" in row
    assert any("36.00% · ✗ incorrect" in x for x in lines)
    assert lines.index(row) < lines.index(next(x for x in lines if x.startswith("| gaussian | 4096")))
    goals = "\n".join(mod.goals(recs))
    assert "gaussian <= 3% rel L2 at >= 1000 TFLOP/s: MISSED" in goals
    # the lowest error whatever its time, then the lowest error within 5% of amax's time
    assert "outliers T=16384, lowest error: cudnn-fp8-smoothk 2.00% vs amax 9.00% (4.50x lower), time +9.2% vs amax: " \
        "MISSED (time +9.2% > 5%)" in goals
    assert "outliers T=16384, lowest error at <= 5% cost: cudnn-fp8-hadamard 5.80% vs amax 9.00% (1.55x lower), " \
        "time +2.9% vs amax: MISSED (error gain 1.55x < 2.5x)" in goals
    # amax beyond the FP8 limit is never timed: its gaussian time of the same shape stands in
    assert "channel-outliers T=16384, lowest error at <= 5% cost: cudnn-fp8-hadamard 9.00% vs amax 36.00% (4.00x lower), " \
        "time +2.9% vs amax (gaussian time: own cell not timed): met" in goals
    assert "anchor: bf16 cudnn on gaussian 0.25% at 687 TFLOP/s" in goals
    out = mod.report(str(path), str(tmp_path / "p.png"))
    assert os.path.getsize(tmp_path / "p.png") > 1000 and "plot:" in out


def test_an_untimed_recipe_takes_its_gaussian_time():
    T = 16384
    recs = [_rec("cudnn-fp8", "gaussian", T, False, 0.055, 2.0), _rec("cudnn-fp8-hadamard", "gaussian", T, False, 0.055, 2.4),
            _rec("cudnn-fp8", "outliers", T, False, 0.12, 0, status="incorrect"),
            _rec("cudnn-fp8-hadamard", "outliers", T, False, 0.04, 0, status="incorrect")]
    goals = "\n".join(mod.goals(recs))
    assert "outliers T=16384, lowest error: cudnn-fp8-hadamard 4.00% vs amax 12.00% (3.00x lower), time +20.0% vs amax " \
        "(gaussian time: own cell not timed): MISSED (time +20.0% > 5%)" in goals


def test_gaussian_goal_met_and_the_grid():
    recs = [_rec("cudnn-fp8-s256", "gaussian", 16384, False, 0.029, 2.0, tflops=1100.0)]
    assert "met: lowest error cudnn-fp8-s256 2.90% at 1100" in "\n".join(mod.goals(recs))
    assert mod.SHAPES[0] == mod.GOAL_SHAPE and len(mod.BACKENDS) == 11 and mod.BACKENDS[0] == "cudnn"


def test_the_report_imports_no_jax():
    code = "import sys, attnlab.report.fp8_recipes; assert 'jax' not in sys.modules, 'jax imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
