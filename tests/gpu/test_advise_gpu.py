"""``attnlab advise`` on an NVIDIA GPU (issue 16, item 3): a small model context, every phase.

    python -m pytest -q -m gpu tests/gpu/test_advise_gpu.py
"""
import json

import jax
import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.gpu


def test_advise_llama_8b_at_4k_picks_a_correct_backend_and_fits_a_batch(tmp_path):
    if jax.devices()[0].platform != "gpu":
        pytest.skip("needs a GPU")
    from attnlab.cli import main

    out = tmp_path / "adv"
    r = CliRunner().invoke(main, ["advise", "--model", "llama-3.1-8b", "--context", "4k", "--backends", "xla,cudnn",
                                  "--repeats", "5", "--out", str(out)], terminal_width=250)
    assert r.exit_code == 0, r.output
    adv = json.loads((out / "advise.json").read_text())
    assert {(p["phase"], p["q_len"]) for p in adv["phases"]} == {("prefill", 4096), ("decode", 1), ("decode", 4),
                                                                   ("train", 4096)}
    for c in adv["cells"]:
        if c["best"] is not None:
            assert c["backends"][c["best"]]["status"] == "ok"
    assert all(p["model_ms"] for p in adv["phases"]), adv["phases"]
    m = adv["memory"][0]
    assert m["device_bytes"] and m["max_batch"] >= 1        # 8B in bf16 leaves room for a 4k cache (512 MiB/seq)
