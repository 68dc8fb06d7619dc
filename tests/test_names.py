"""Issue 23 item 5: dtype short names, backend names in any case, "did you mean" for unknown names."""
import json

import pytest
from click.testing import CliRunner

from attnlab import backends
from attnlab.cli import main
from attnlab.core.models import preset
from attnlab.core.problem import Problem
from attnlab.sweep import SweepError, build, load_toml
from attnlab.core.workload import Workload


@pytest.mark.parametrize("alias,name", [("bf16", "bfloat16"), ("BF16", "bfloat16"), ("fp16", "float16"),
                                        ("f16", "float16"), ("f32", "float32"), ("fp32", "float32"),
                                        ("f64", "float64"), ("fp64", "float64"), ("Float32", "float32")])
def test_dtype_short_names_in_sweeps_and_problems(alias, name):
    assert {c.dtype for c in build({"backends": "xla", "dtype": alias}).cells()} == {name}
    assert Problem(1, 8, 8, 2, 2, 4, alias).dtype == name
    # f16 is float16 (2 bytes), not NumPy's 16-byte float128
    assert Workload(1, 8, 8, 2, 2, 4, alias).bytes() == Workload(1, 8, 8, 2, 2, 4, name).bytes()


def test_dtype_short_names_in_a_toml_file(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('[sweep]\nbackends = ["naive"]\ndtype = ["bf16", "f32"]\n')
    values, _ = load_toml(p)
    assert [c.dtype for c in build(values).cells()] == ["bfloat16", "float32"]


def test_bench_takes_bf16_and_cudnn_in_any_case(tmp_path):
    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["bench", "--backends", "NAIVE", "--dtype", "f32", "--seq", "8", "--heads", "2",
                                  "--head-dim", "4", "--repeats", "1", "--min-time", "0", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert rec["backend"] == "naive" and rec["dtype"] == "float32"


def test_backend_names_ignore_case():
    assert backends.get("cuDNN").name == "cudnn" and backends.get("XLA").name == "xla"
    assert build({"backends": "cuDNN,Naive"}).backends == ["cudnn", "naive"]


@pytest.mark.parametrize("values,words", [
    ({"backends": "xlaa"}, "did you mean 'xla'?"),
    ({"backends": "cudnn-fp8-hadamrd"}, "did you mean 'cudnn-fp8-hadamard'?"),
    ({"backends": "xla", "dtype": "bfloat"}, "did you mean 'bfloat16'?"),
    ({"backends": "xla", "mode": "fwd_bwd"}, "did you mean 'fwd+bwd'?"),
])
def test_unknown_names_get_the_closest(values, words):
    with pytest.raises(SweepError) as e:
        build(values)
    assert words in str(e.value)


def test_an_unknown_backend_is_not_answered_with_every_name():
    with pytest.raises(SweepError) as e:
        build({"backends": "warp"})
    msg = str(e.value)
    assert "'warp'" in msg and "attnlab backends" in msg and "pallas-paged" not in msg
    with pytest.raises(ValueError, match="did you mean 'xla'"):
        backends.get("xlaa")


def test_cli_suggests_backend_model_and_step(tmp_path):
    r = CliRunner().invoke(main, ["bench", "--backends", "xlaa", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "did you mean 'xla'?" in r.output and "Traceback" not in r.output
    assert "torch-efficient" not in r.output
    r = CliRunner().invoke(main, ["advise", "--model", "llama3-8b", "--context", "256", "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "nearest: llama-3.1-8b," in r.output and "presets: " in r.output
    r = CliRunner().invoke(main, ["run", "--out", str(tmp_path / "r"), "--sections", "jaxnn"])
    assert r.exit_code == 2 and "did you mean 'jax_nn'?" in r.output and "Traceback" not in r.output
    with pytest.raises(ValueError, match="gpt-5.*llama-3.1-8b"):   # nothing close: the ten presets are listed
        preset("gpt-5")


def test_run_help_lists_the_step_ids():
    from attnlab.lab import STEPS

    r = CliRunner().invoke(main, ["run", "--help"], terminal_width=200)
    assert all(s in r.output for s in STEPS)
