"""The measurement engine on an NVIDIA GPU: CUPTI kernel time, runtime memory, % of peak."""
import os

import pytest

from attnlab.measure import Cell, Options, kernel_timer_available, measure_cell
from attnlab.reference import compiled

pytestmark = pytest.mark.gpu


def test_cupti_kernel_time_and_metrics():
    assert kernel_timer_available() is None
    r = measure_cell(Cell("cudnn", 2, 1024, 1024, 8, 8, 64, "bfloat16", True), Options(repeats=10))
    assert r["status"] == "ok", r["reason"]
    assert r["timer"] == "cupti" and 0 < r["kernel_ms"] < r["wall_ms"]
    assert r["dispatch_ms"] == pytest.approx(r["wall_ms"] - r["kernel_ms"])
    assert r["kernel_n"] >= 10 and r["kernel_min_ms"] <= r["kernel_ms"] <= r["kernel_max_ms"]
    assert 0 < r["pct_peak"] < 100 and r["process_peak_bytes"] > 0 and r["peak_tflops"] == 989.4
    assert r["checked_fraction"] == 1.0 and r["checks"]["float32_device"]["ok"] and r["margin"] >= 1


@pytest.mark.parametrize("mode", ["fwd+bwd", "bwd"])
def test_backward_modes_on_gpu(mode):
    r = measure_cell(Cell("cudnn", 1, 512, 512, 4, 4, 64, "bfloat16", True, None, mode), Options(repeats=5))
    assert r["status"] == "ok", r["reason"]
    assert r["grad_check"] == "ok" and r["kernel_ms"] > 0 and r["grad_checked_fraction"] == 1.0


@pytest.mark.parametrize("backend,dtype", [("cudnn", "bfloat16"), ("cudnn", "float16"), ("xla", "bfloat16")])
def test_right_gradients_pass_the_worst_row_rule(backend, dtype):
    """The gradients' worst-row rule (2 x the emulation's worst row + floor) on GPU kernels' right gradients: GQA,
    a window, T=2048; the margin is printed."""
    r = measure_cell(Cell(backend, 2, 2048, 2048, 8, 2, 128, dtype, True, (256, 0), "fwd+bwd"), Options(repeats=3))
    print({n: (round(g["row_err"] / g["row_limit"], 3), round(g["rel_err"] / g["limit"], 3))
           for n, g in r.get("grad_checks", {}).items()})
    assert r["status"] == "ok", r["reason"]
    assert r["grad_check"] == "ok" and all(g["row_limit"] > 0 for g in r["grad_checks"].values())


def test_whole_output_check_of_a_16k_cell_takes_seconds():
    """Issue 11: the check of a T=16384 cell (whole output vs float32, rows vs float64) is cheap."""
    import time

    from attnlab.reference.inputs import random_qkv
    from attnlab.measure import check

    q, k, v = random_qkv(1, 16384, 16384, 16, 16, 128, "bfloat16", seed=0)
    out = attnlab_attention(q, k, v)
    compiled.clear_results()
    t0 = time.perf_counter()
    chk = check.check_forward(out, q, k, v, check.Semantics(causal=True), ref_key="t16k")
    first = time.perf_counter() - t0
    compiled.clear_results()
    t0 = time.perf_counter()
    check.check_forward(out, q, k, v, check.Semantics(causal=True), ref_key="t16k-again")
    again = time.perf_counter() - t0
    print(f"check of a T=16384 causal cell: {first:.2f} s with compilation, {again:.2f} s compiled; "
          f"rel err {chk['rel_err']:.3e}, margin {chk['margin']:.2f}")
    assert chk["ok"] and chk["checked_fraction"] == 1.0
    share = int(os.environ.get("ATTNLAB_GPU_PROCS", "1"))      # pytest processes beside this one on the GPU
    assert again < 5.0 * share and first < 30.0 * share


def attnlab_attention(q, k, v):
    import jax

    import attnlab

    return jax.jit(lambda q, k, v: attnlab.attention(q, k, v, is_causal=True, implementation="cudnn"))(q, k, v)
