"""Peer backends on the CPU: their reasons with libraries or GPU absent, tokamax's XLA path, wiring."""
import importlib.util
import json

import jax
import jax.numpy as jnp
import pytest
from click.testing import CliRunner

import attnlab
from attnlab import UnsupportedError, backends
from attnlab.reference import cases
from attnlab.backends.te import _mask_type
from attnlab.cli import main
from attnlab.reference.inputs import random_qkv
from attnlab.measure import Cell, Options, measure_cell
from attnlab.reference.float64 import check_close
from attnlab.core.prepare import prepare

PEERS = ["cudnn-fp8", "cudnn-fp8-unit", "te", "te-fp8", "tokamax-mosaic", "tokamax-triton", "pallas-triton",
         "pallas-mosaic", "torch-flash", "torch-cudnn", "torch-efficient"]
HAS_TOKAMAX = importlib.util.find_spec("tokamax") is not None


def spec(B=1, T=128, S=128, N=4, K=4, H=64, dtype="bfloat16", **kw):
    s = jax.ShapeDtypeStruct
    return prepare(s((B, T, N, H), dtype), s((B, S, K, H), dtype), s((B, S, K, H), dtype), **kw).spec


@pytest.mark.parametrize("name", PEERS)
@pytest.mark.skipif(jax.default_backend() == "gpu", reason="a GPU has these peers: tests/gpu/test_peers_gpu.py runs them")
def test_peer_is_registered_and_says_why_not_here(name):
    b = backends.get(name)
    why = b.available()
    assert why and ("GPU" in why or "not installed" in why), why
    q, k, v = random_qkv(1, 128, 128, 2, 2, 64, "float16")
    with pytest.raises(UnsupportedError) as e:
        attnlab.attention(q, k, v, implementation=name)
    assert str(e.value).startswith(f"{name}: ")
    registered = [b.name for b in backends.all_backends() if name in b.variant_names()]   # an FP8 recipe: cudnn-fp8
    assert registered and registered[0] in attnlab.explain(q, k, v).reasons


def test_backends_json_lists_every_backend_with_reason_and_version():
    r = CliRunner().invoke(main, ["backends", "--json"])
    assert r.exit_code == 0
    data = json.loads(r.output)
    assert set(data) == set(backends.names())
    for name in backends.names():
        entry, why_not = data[name], backends.get(name).available()
        assert {"available", "reason", "version"} <= set(entry)
        # available exactly when the backend says so, and then without a reason; else its own reason
        assert entry["available"] is (why_not is None) and entry["reason"] == why_not, (name, entry, why_not)
    assert data["naive"] == {**data["naive"], "available": True, "reason": None}
    if jax.default_backend() != "gpu":
        assert data["cudnn"]["available"] is False and "GPU" in data["cudnn"]["reason"]


def test_capability_reasons_from_specs():
    g = backends.get
    assert "multiple of 16" in g("cudnn-fp8").supports(spec(H=72))
    assert "K != N" in g("cudnn-fp8").supports(spec(K=1))
    assert "no bias" in g("cudnn-fp8").supports(spec(local_window_size=(4, 0), is_causal=True))
    assert g("cudnn-fp8").supports(spec(is_causal=True)) is None
    assert "float16 only" in g("pallas-mosaic").supports(spec())
    assert "T == S" in g("pallas-mosaic").supports(spec(dtype="float16", T=128, S=256, is_causal=True))
    assert "multiple of 64" in g("pallas-mosaic").supports(spec(dtype="float16", H=96))
    assert g("pallas-mosaic").supports(spec(dtype="float16")) is None
    assert "no causal mode" in g("pallas-mosaic").mode_reason(spec(dtype="float16", is_causal=True), "fwd+bwd")
    assert g("pallas-mosaic").mode_reason(spec(dtype="float16"), "fwd+bwd") is None
    assert "key/value heads" in g("pallas-triton").supports(spec(K=2))
    assert "block size" in g("pallas-triton").supports(spec(T=200, S=200))
    assert "local_window_size" in g("torch-flash").supports(spec(local_window_size=3))
    assert "float32" in g("torch-flash").supports(spec(dtype="float32"))
    assert g("torch-efficient").supports(spec(dtype="float32")) is None
    assert "forward only" in g("torch-flash").mode_reason(spec(), "bwd")


def test_te_mask_types_and_polarity_rules():
    assert _mask_type(spec()) == "no_mask"
    assert _mask_type(spec(is_causal=True)) == "causal"
    import jax.numpy as jnp

    ql = jnp.array([100], jnp.int32)
    assert _mask_type(spec(query_seq_lengths=ql)) == "padding"
    assert _mask_type(spec(query_seq_lengths=ql, is_causal=True)) == "padding_causal"


def test_forward_only_backends_record_backward_as_unsupported():
    class FwdOnly(backends.Backend):
        name = "test-fwd-only"
        forward_only = True

        def run(self, p):
            return backends.get("naive").run(p)

    with backends.registered(FwdOnly()):
        r = measure_cell(Cell("test-fwd-only", 1, 32, 32, 2, 2, 8, "float32", mode="bwd"), Options(repeats=2))
        assert r["status"] == "unsupported" and "forward only" in r["reason"]
        r = measure_cell(Cell("test-fwd-only", 1, 32, 32, 2, 2, 8, "float32"), Options(repeats=2, max_input_sets=1))
        assert r["status"] == "ok"


def test_fixed_limit_backends_are_judged_by_their_limit():
    class Loose(backends.Backend):
        name = "test-loose"
        rel_l2_limit = 0.1
        rel_l2_rule = "test: rel L2 <= 0.1"

        def run(self, p):
            return backends.get("naive").run(p) * 1.02   # 2% off: wrong for float32, fine for this limit

    with backends.registered(Loose()):
        r = measure_cell(Cell("test-loose", 1, 32, 32, 2, 2, 8, "float32"), Options(repeats=2, max_input_sets=1))
        assert r["status"] == "ok" and r["tolerance"] == "test: rel L2 <= 0.1"


def test_backend_facts_land_in_the_record_and_a_failing_fact_is_reported():
    class Facts(backends.Backend):
        name = "test-facts"

        def run(self, p):
            return backends.get("naive").run(p)

        def facts(self, fwd, q, k, v, fwd_as=None):
            same = bool(jnp.all(jax.jit(fwd)(q, k, v) == jax.jit(fwd_as("naive"))(q, k, v)))
            return {"q_shape": list(q.shape), "bit_identical_to_naive": same}

    class BadFacts(Facts):
        name = "test-bad-facts"

        def facts(self, fwd, q, k, v, fwd_as=None):
            raise RuntimeError("cannot read the program")

    with backends.registered(Facts(), BadFacts()):
        r = measure_cell(Cell("test-facts", 1, 32, 32, 2, 2, 8, "float32", True), Options(repeats=2, max_input_sets=1))
        assert r["status"] == "ok" and r["facts"] == {"q_shape": [1, 32, 2, 8], "bit_identical_to_naive": True}
        r = measure_cell(Cell("test-bad-facts", 1, 32, 32, 2, 2, 8, "float32"), Options(repeats=2, max_input_sets=1))
        assert r["status"] == "ok" and "cannot read the program" in r["facts"]["error"]
        r = measure_cell(Cell("naive", 1, 32, 32, 2, 2, 8, "float32"), Options(repeats=2, max_input_sets=1))
        assert "facts" not in r


@pytest.mark.skipif(not HAS_TOKAMAX, reason="tokamax not installed")
@pytest.mark.parametrize("mode", ["none", "causal", "padding", "causal+window", "bias+causal"])
def test_tokamax_xla_path_matches_reference(mode):
    q, k, v, kw = cases.build(mode, batch=2, q_len=16, kv_len=16, heads=4, kv_heads=2, head_dim=16, seed=6)
    out = attnlab.attention(q, k, v, implementation="tokamax-xla", **kw)
    assert check_close(out, q, k, v, **kw).ok


@pytest.mark.skipif(not HAS_TOKAMAX, reason="tokamax not installed")
def test_tokamax_xla_in_a_sweep_cell():
    r = measure_cell(Cell("tokamax-xla", 1, 64, 64, 4, 2, 16, "float32", True, mode="fwd+bwd"), Options(repeats=2))
    assert r["status"] == "ok" and r["grad_check"] == "ok"


@pytest.mark.skipif(not HAS_TOKAMAX, reason="tokamax not installed")
def test_tokamax_refuses_what_it_cannot_run_before_it_fails_inside():
    """A window with T != S (tokamax places it by key index) and, on a CPU, float16 (its dot asks for
    F16_F16_F32): UnsupportedError with the reason, never tokamax's own broadcasting or precision error."""
    q, k, v, kw = cases.build("causal+window", batch=1, q_len=5, kv_len=8, heads=2, kv_heads=2, head_dim=16, seed=1)
    with pytest.raises(UnsupportedError, match="T != S"):
        attnlab.attention(q, k, v, implementation="tokamax-xla", **kw)
    assert "T != S" in attnlab.explain(q, k, v, **kw).reasons["tokamax-xla"]
    if jax.default_backend() == "cpu":
        q, k, v = (x.astype(jnp.float16) for x in random_qkv(1, 8, 8, 2, 2, 16, "float32", seed=2))
        with pytest.raises(UnsupportedError, match="F16_F16_F32"):
            attnlab.attention(q, k, v, implementation="tokamax-xla")
