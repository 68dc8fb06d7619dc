"""Every peer backend that is available on this GPU, against the float64 reference."""
import jax
import jax.numpy as jnp
import pytest

import attnlab
from attnlab import backends
from attnlab.reference.inputs import random_qkv
from attnlab.measure import Cell, Options, measure_cell
from attnlab.reference.float64 import check_close

pytestmark = pytest.mark.gpu

JAX_PEERS = ["te", "te-fp8", "tokamax-mosaic", "tokamax-triton", "tokamax-xla", "pallas-triton", "pallas-mosaic"]


def _need(name):
    why = backends.get(name).available()
    if why:
        pytest.skip(f"{name}: {why}")
    return backends.get(name)


@pytest.mark.parametrize("name", JAX_PEERS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 1])
def test_jax_peer_matches_reference(name, causal, kv_heads):
    b = _need(name)
    dtype = "float16" if name == "pallas-mosaic" else "bfloat16"
    q, k, v = random_qkv(2, 256, 256, 4, kv_heads, 128, dtype, seed=7)
    why = b.why_not(attnlab.explain(q, k, v, is_causal=causal).spec)
    if why:
        pytest.skip(f"{name}: {why}")
    out = jax.jit(lambda q, k, v: attnlab.attention(q, k, v, is_causal=causal, implementation=name))(q, k, v)
    verdict = check_close(out, q, k, v, is_causal=causal)
    assert verdict.ok, verdict


def test_te_is_fused_and_handles_padding():
    te = _need("te")
    q, k, v = random_qkv(2, 256, 256, 4, 2, 64, "bfloat16", seed=3)
    fn = lambda q, k, v: attnlab.attention(q, k, v, is_causal=True, implementation="te")  # noqa: E731
    assert te.fused_in_hlo(fn, q, k, v)
    kw = dict(query_seq_lengths=jnp.array([200, 256], jnp.int32), key_value_seq_lengths=jnp.array([256, 100], jnp.int32))
    out = attnlab.attention(q, k, v, implementation="te", **kw)
    assert check_close(out, q, k, v, **kw).ok


def test_te_fp8_reports_whether_fp8_engaged():
    te8 = _need("te-fp8")
    q, k, v = random_qkv(1, 512, 512, 4, 4, 128, "bfloat16", seed=4)
    f8 = lambda q, k, v: attnlab.attention(q, k, v, is_causal=True, implementation="te-fp8")  # noqa: E731
    f16 = lambda q, k, v: attnlab.attention(q, k, v, is_causal=True, implementation="te")  # noqa: E731
    engaged = te8.fp8_engaged(f8, q, k, v)
    same = bool(jnp.all(jax.jit(f8)(q, k, v) == jax.jit(f16)(q, k, v)))
    print(f"te-fp8: FP8 in compiled program: {engaged}; output bit-identical to te: {same}")
    # the two facts must agree: FP8 in the program changes the output, no FP8 leaves it bit-identical
    assert engaged != same, f"fp8_in_program={engaged} but bit_identical_to_te={same}"


@pytest.mark.parametrize("name", ["torch-flash", "torch-cudnn", "torch-efficient"])
def test_torch_peer_cell(name):
    _need(name)
    r = measure_cell(Cell(name, 2, 1024, 1024, 8, 8, 128, "bfloat16", True), Options(repeats=5))
    assert r["status"] == "ok", r["reason"]
    assert r["timer"] == "cupti", r.get("timer_note")     # the same clock as every JAX backend
    assert r["kernel_ms"] > 0 and r["checked_fraction"] == 1.0 and r["runtime_peak_bytes"] >= 0


@pytest.mark.parametrize("name", ["te", "te-fp8"])
def test_te_sweep_records_say_how_te_ran(name):
    _need(name)
    r = measure_cell(Cell(name, 1, 1024, 1024, 8, 8, 128, "bfloat16", True), Options(repeats=3))
    assert r["status"] == "ok", r["reason"]
    assert r["facts"]["te_fused"] is True
    if name == "te-fp8":
        print(f"te-fp8 facts: {r['facts']}")
        q, k, v = random_qkv(1, 1024, 1024, 8, 8, 128, "bfloat16", seed=0)   # the cell's first input set
        f8 = lambda q, k, v: attnlab.attention(q, k, v, is_causal=True, implementation="te-fp8")  # noqa: E731
        f16 = lambda q, k, v: attnlab.attention(q, k, v, is_causal=True, implementation="te")  # noqa: E731
        assert r["facts"]["fp8_in_program"] == backends.get("te-fp8").fp8_engaged(f8, q, k, v)
        assert r["facts"]["bit_identical_to_te"] == bool(jnp.all(jax.jit(f8)(q, k, v) == jax.jit(f16)(q, k, v)))
