"""Dtypes a CPU sweep used to get wrong: float64 cells without x64, float16 through XLA under jit."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

import attnlab
import attnlab.reference.inputs
from attnlab.reference import cases
from attnlab.cli import main
from attnlab.measure.cell import Cell, Options, measure_cell
from attnlab.reference.float64 import check_close
from attnlab.core.workload import Workload

FAST = Options(repeats=2, warmup=1, pipelined_calls=2)
on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the float16 refusal is the CPU's")


# --- float64 cells run in x64, truly float64 ---------------------------------------------------

@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_float64_cell_is_really_float64_without_x64(mode):
    assert not jax.config.jax_enable_x64
    r = measure_cell(Cell("naive", 1, 16, 16, 2, 1, 8, "float64", causal=True, mode=mode), FAST)
    assert r["status"] == "ok", r["reason"]
    assert r["dtype"] == r["out_dtype"] == "float64"
    assert r["bytes"] == Workload(1, 16, 16, 2, 1, 8, "float64", True).bytes(mode)
    assert r["rel_err"] < 1e-10 and (mode == "fwd" or r["grad_check"] == "ok")
    assert not jax.config.jax_enable_x64          # the cell's x64 does not leak out


def test_bench_cli_float64_records_float64(tmp_path):
    out = tmp_path / "b"
    args = ["bench", "--backends", "naive,xla", "--batch", "1", "--seq", "16", "--heads", "2", "--kv-heads", "1",
            "--head-dim", "8", "--dtype", "float64", "--causal", "true", "--repeats", "2", "--out", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    recs = {x["backend"]: x for x in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert set(recs) == {"naive", "xla"}
    x = recs["naive"]                                  # never a float32 run labelled float64
    assert x["dtype"] == x["out_dtype"] == "float64", x
    assert x["bytes"] == Workload(1, 16, 16, 2, 1, 8, "float64", True).bytes("fwd")
    assert x["status"] == "ok" and x["rel_err"] < 1e-10
    # jax.nn computes its softmax in float32 even for float64 inputs: xla refuses float64, said why
    assert recs["xla"]["status"] == "unsupported" and "float32" in recs["xla"]["reason"]


def test_xla_refuses_float64():
    """jax.nn's softmax runs in float32 for float64 inputs (float32-accurate, ~1e-7): xla refuses float64
    with that reason and auto runs naive, which is float64-accurate."""
    with jax.enable_x64(True):
        q, k, v = attnlab.reference.inputs.random_qkv(1, 8, 8, 2, 2, 8, "float64", seed=1)
        e = attnlab.explain(q, k, v, is_causal=True)
        assert e.chosen == "naive" and "softmax in float32" in e.reasons["xla"]
        with pytest.raises(attnlab.UnsupportedError, match="xla: float64"):
            attnlab.attention(q, k, v, implementation="xla")
        out = attnlab.attention(q, k, v, is_causal=True)
        assert out.dtype == jnp.float64 and attnlab.check_close(out, q, k, v, is_causal=True).rel_err < 1e-12


# --- float16 through XLA on a CPU --------------------------------------------------------------

@on_cpu
def test_xla_runs_float16_on_cpu_eager_and_under_jit_as_jax_nn_eager():
    """jax.nn runs this eagerly (it retries at default precision) but, before JAX 0.12, fails under jit; attnlab
    runs both, computing in float32 and casting back, with jax.nn's eager result."""
    q, k, v = attnlab.reference.inputs.random_qkv(1, 8, 8, 2, 2, 8, "float16", seed=1)
    e = attnlab.explain(q, k, v, is_causal=True)
    assert e.reasons["xla"] is None and e.chosen == "xla"
    want = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    for fn in (attnlab.attention, jax.jit(attnlab.attention, static_argnames=("is_causal", "implementation"))):
        out = fn(q, k, v, is_causal=True, implementation="xla")
        assert out.dtype == jnp.float16
        np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), rtol=1e-3, atol=1e-3)
    try:   # what attnlab does that jax.nn could not (JAX 0.10, 0.11; 0.12.1 runs it)
        jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla"))(q, k, v)
    except Exception as e:  # noqa: BLE001
        assert "F16_F16_F32" in str(e)


@on_cpu
@pytest.mark.parametrize("mode", ["causal", "bias+window+padding"])
def test_auto_float16_on_cpu_works_under_jit(mode):
    q, k, v, kw = cases.build(mode, batch=2, q_len=16, kv_len=16, heads=4, kv_heads=2, head_dim=16, dtype="float16", seed=3)
    static = {n: kw.pop(n) for n in ("is_causal", "local_window_size") if n in kw}
    fn = jax.jit(lambda q, k, v, t: attnlab.attention(q, k, v, **t, **static))
    out = fn(q, k, v, kw)
    assert out.dtype == jnp.float16
    assert check_close(out, q, k, v, **kw, **static).ok
    grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, kw).astype(jnp.float32)), argnums=(0, 1, 2)))(q, k, v)
    assert all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in grads)


@on_cpu
def test_xla_float16_bench_cell_on_cpu_runs():
    r = measure_cell(Cell("xla", 1, 16, 16, 2, 2, 8, "float16"), FAST)
    assert r["status"] == "ok", r["reason"]
    r = measure_cell(Cell("naive", 1, 16, 16, 2, 2, 8, "float16", mode="fwd+bwd"), FAST)
    assert r["status"] == "ok", r["reason"]


@pytest.mark.filterwarnings("ignore:Explicitly requested dtype")
def test_numpy_float64_inputs_without_x64_run_as_float32():
    """What the docstring says: without x64 a NumPy float64 call is a float32 call, judged as one."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, 2, 8)) for _ in range(3))
    assert not jax.config.jax_enable_x64
    assert attnlab.explain(q, k, v).spec.dtype == "float32"
    for impl in ("naive", "xla"):
        out = attnlab.attention(q, k, v, is_causal=True, implementation=impl)
        assert out.dtype == jnp.float32 and check_close(out, q, k, v, is_causal=True).ok
    empty = attnlab.attention(q, k, v, bias=np.full((1, 1, 8, 8), -np.inf), implementation="naive")
    assert np.array_equal(np.asarray(empty), np.zeros(q.shape))     # rows a -inf bias empties: 0, not NaN
    with jax.enable_x64(True):
        assert attnlab.explain(q, k, v).spec.dtype == "float64"
        assert attnlab.attention(q, k, v, implementation="naive").dtype == jnp.float64
