"""The estimate before a sweep on an NVIDIA GPU is within 2x of the sweep's wall time: first from the
defaults, then calibrated from the first sweep's compiles (``attnlab.measure.calibration``).

    python -m pytest -q -m gpu tests/gpu/test_estimate_gpu.py
"""
import re
import time

import jax
import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.gpu


def test_a_small_gpu_bench_is_estimated_within_2x(tmp_path, monkeypatch):
    if jax.devices()[0].platform != "gpu":
        pytest.skip("needs a GPU")
    from attnlab.cli import main
    from attnlab.core import device
    from attnlab.measure import calibration

    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))
    calibration.forget()
    seen = []
    for i, seq in enumerate(("1024,2048", "1536,3072")):   # new shapes: nothing compiled by the first run is reused
        args = ["bench", "--backends", "xla,cudnn", "--seq", seq, "--heads", "8", "--head-dim", "128",
                "--dtype", "bfloat16", "--causal", "both", "--out", str(tmp_path / f"b{i}")]
        t0 = time.perf_counter()
        r = CliRunner().invoke(main, args, terminal_width=250)
        wall = time.perf_counter() - t0
        assert r.exit_code == 0, r.output
        est = float(re.search(r"~([\d.e+]+) s in all", r.output).group(1))
        seen.append((est, round(wall, 1), r.output.splitlines()[0][-220:], r.output.rstrip().splitlines()[-1],
                     calibration.stored(device.current())))     # what it learnt, check_x too
        calibration.forget()   # the second run reads what the first stored, as a new process would
    print(seen)
    for est, wall, *_ in seen:
        assert wall / 2 <= est <= 2 * wall, seen
