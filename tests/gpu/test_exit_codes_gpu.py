"""No exit code but 0, 1, 2 or 130 on an NVIDIA GPU, where threads inside cuDNN's and Triton's
compiles are involved (the CPU twin: ``tests/test_exit_codes.py``; the driver: ``tests/exit_driver.py``).

    python -m pytest -q -m gpu tests/gpu/test_exit_codes_gpu.py

Every run starts at once, four at a time on the one GPU (no preallocation: ``tests/conftest.py``).
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from exit_driver import assert_clean_exit, run_cli  # noqa: E402

pytestmark = pytest.mark.gpu

BACKENDS = "xla,cudnn,pallas-triton"
SHAPES = ["--seq", "256,512", "--heads", "4", "--head-dim", "64", "--dtype", "bfloat16", "--causal", "both",
          "--repeats", "3"]
MOMENTS = {"before the first cell": "@start", "mid-compile": "@phase compile", "mid-check": "@phase check",
           "between cells": "@cell"}
#: Ctrl-C this many seconds into a sweep of 32 cells (xla, cudnn and tokamax-mosaic as in the first report).
AFTER_S = (4, 8, 12, 16, 20)
RUNS = {
    **{f"over budget {i}": (["bench", "--backends", BACKENDS, *SHAPES, "--cell-budget", "0.001"], None)
       for i in range(3)},
    "bench": (["bench", "--backends", BACKENDS, *SHAPES], None),
    "advise": (["advise", "--model", "llama-3.1-8b", "--context", "512", "--backends", "xla,cudnn,attnlab-decode",
                "--repeats", "3"], None),
    **{f"{moment} {i}": (["bench", "--backends", BACKENDS, *SHAPES, "--mode", "fwd,fwd+bwd"], marker)
       for moment, marker in MOMENTS.items() for i in range(3)},
    **{f"after {s} s": (["bench", "--backends", f"{BACKENDS},tokamax-mosaic", *SHAPES, "--mode", "fwd,fwd+bwd"],
                        float(s)) for s in AFTER_S},
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path_factory.mktemp("exits")
    with ThreadPoolExecutor(4) as pool:
        futs = {name: pool.submit(run_cli, [*args, "--out", str(root / f"o{n}")], marker, 240, False)
                for n, (name, (args, marker)) in enumerate(RUNS.items())}
        return {name: f.result() for name, f in futs.items()}


@pytest.mark.parametrize("name", [n for n, (_, marker) in RUNS.items() if marker is None])
def test_runs_to_the_end_exit_0(outcomes, name):
    code, out, _ = outcomes[name]
    assert_clean_exit(code, out)
    assert code == 0, out
    if name.startswith("over budget"):
        assert "@phase" not in out and "over_budget" in out, out


@pytest.mark.parametrize("name", [n for n, (_, marker) in RUNS.items() if marker is not None])
def test_ctrl_c_exits_130_within_a_second(outcomes, name):
    code, out, after = outcomes[name]
    assert_clean_exit(code, out)
    if name.startswith("after") and after is None:   # the sweep ended before the signal
        assert code == 0, out
        return
    assert after is not None, out
    assert after < 3, f"{after:.1f} s from Ctrl-C to the exit"
    assert code == 130, out
