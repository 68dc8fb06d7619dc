"""The measurement engine on an NVIDIA GPU: CUPTI kernel time, runtime memory, % of peak."""
import pytest

from attnlab.measure import Cell, Options, kernel_timer_available, measure_cell

pytestmark = pytest.mark.gpu


def test_cupti_kernel_time_and_metrics():
    assert kernel_timer_available() is None
    r = measure_cell(Cell("cudnn", 2, 1024, 1024, 8, 8, 64, "bfloat16", True), Options(repeats=10))
    assert r["status"] == "ok", r["reason"]
    assert r["timer"] == "cupti" and 0 < r["kernel_ms"] < r["wall_ms"]
    assert r["dispatch_ms"] == pytest.approx(r["wall_ms"] - r["kernel_ms"])
    assert r["kernel_n"] >= 10 and r["kernel_min_ms"] <= r["kernel_ms"] <= r["kernel_max_ms"]
    assert 0 < r["pct_peak"] < 100 and r["runtime_peak_bytes"] > 0 and r["peak_tflops"] == 989.4


@pytest.mark.parametrize("mode", ["fwd+bwd", "bwd"])
def test_backward_modes_on_gpu(mode):
    r = measure_cell(Cell("cudnn", 1, 512, 512, 4, 4, 64, "bfloat16", True, None, mode), Options(repeats=5))
    assert r["status"] == "ok", r["reason"]
    assert r["grad_check"] == "ok" and r["kernel_ms"] > 0
