"""Adding a backend is one new module and one line: the registry is one declared list (``BUILTINS``),
and a backend's needs are data (``library``, ``min_compute_capability``) that ``available``, ``version``,
``attnlab backends``, ``explain`` and the environment's optional libraries all read."""
from __future__ import annotations

import json
import sys

import jax
import numpy as np
import pytest
from click.testing import CliRunner

import attnlab
from attnlab import backends
from attnlab.measure import env
from attnlab.backends.base import Backend, NativeBackend
from attnlab.cli import main

TOY = '''
"""A toy backend in its own module: the naive computation, declaring a library of its own."""
from attnlab.backends.naive import NaiveBackend


class ToyBackend(NaiveBackend):
    name = "toy"
    description = "a toy backend from a module outside attnlab"
    portable = False
    library = ("attnlab_toy_lib", "toy")

    def __init__(self, flavour):
        self.name = f"toy-{flavour}"
'''


@pytest.fixture
def toy_module(tmp_path, monkeypatch):
    (tmp_path / "attnlab_toy_backend.py").write_text(TOY)
    (tmp_path / "attnlab_toy_lib").mkdir()
    (tmp_path / "attnlab_toy_lib" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "attnlab_toy_backend"
    if "toy-plain" in backends.names():
        backends.unregister("toy-plain")
    for m in ("attnlab_toy_backend", "attnlab_toy_lib"):
        sys.modules.pop(m, None)


def test_builtins_are_one_list():
    names = [n for n in backends.names()]
    assert len(backends.BUILTINS) == len(names)
    assert names[:3] == ["naive", "xla", "cudnn"] and names[-2:] == ["attnlab-decode", "pallas-paged"]
    torch_ = backends.get("torch-flash")
    assert isinstance(torch_, NativeBackend) and torch_.native and not hasattr(torch_, "measure_native")
    assert torch_.library == ("torch", "torch") and torch_.min_compute_capability == (8, 0)
    assert backends.get("pallas-mosaic").min_compute_capability == (9, 0)


def test_env_optional_libraries_come_from_the_registry():
    assert list(env.optional_libraries()) == ["flax", "transformer_engine", "tokamax", "torch"]


def test_declared_needs_give_available_and_version():
    class NeedsLib(Backend):
        name = "needs-lib"
        library = ("surely_not_a_module_xyz", "torch")

    class NeedsHopper(Backend):
        name = "needs-hopper"
        min_compute_capability = (9, 0)

    assert "surely_not_a_module_xyz is not installed" in NeedsLib().available()
    assert NeedsLib().version() is None
    assert NeedsLib().libraries() == {"surely_not_a_module_xyz": ("surely_not_a_module_xyz",)}
    if jax.default_backend() != "gpu":
        assert "needs an NVIDIA GPU" in NeedsHopper().available()
    assert Backend().available() is None and Backend().libraries() == {}


def test_a_new_backend_module_plugs_in(toy_module):
    b = backends.load(toy_module, "ToyBackend", ("plain",))   # what a line in BUILTINS does
    assert backends.get("toy-plain") is b and b.available() is None

    # attnlab backends
    r = CliRunner().invoke(main, ["backends", "--json"])
    assert r.exit_code == 0, r.output
    status = json.loads(r.output)
    assert status["toy-plain"]["available"] is True and status["toy-plain"]["version"] is None

    # the environment names its library (found, no distribution metadata)
    assert env.optional_libraries()["attnlab_toy_lib"] == "unknown version"

    # explain and attention
    rng = np.random.default_rng(0)
    q, k, v = (jax.numpy.asarray(rng.standard_normal((1, 8, 2, 16)), jax.numpy.float32) for _ in range(3))
    ex = attnlab.explain(q, k, v)
    assert "toy-plain" in ex.reasons and ex.reasons["toy-plain"] is None
    out = attnlab.attention(q, k, v, implementation="toy-plain")
    ref = attnlab.attention(q, k, v, implementation="naive")
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-6, atol=1e-6)


def test_native_timing_loop_lives_in_measure(monkeypatch):
    """A NativeBackend hands over (fn, sync, sets, extras); measure.native times it (device events
    where CUPTI cannot be used, as here on a CPU), with the backend's own memory hooks. The clock is
    fake: every call of the kernel takes exactly 2 ms of it, so each timer must say 2 ms."""
    import types

    from attnlab.backends.base import NativeCall
    from attnlab.measure import native

    calls = []
    clock = types.SimpleNamespace(now=100.0)
    monkeypatch.setattr(native, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))

    def kernel(q, k, v):
        calls.append(q.shape)
        clock.now += 0.002

    class FakeNative(NativeBackend):
        name = "fake-native"

        def native_fn(self, spec, scale, arg_sets, decode=None):
            sets = [tuple(np.asarray(x) for x in s) for s in arg_sets]

            def event_ms(call):
                t0 = clock.now
                call()
                return (clock.now - t0) * 1e3

            return NativeCall(kernel, lambda: None, sets,
                              {"event_ms": event_ms, "reset_peak": lambda: None, "peak_bytes": lambda: 123,
                               "peak_scope": "fake"})

    x = jax.numpy.zeros((1, 4, 2, 8))
    rec = native.time_kernel(FakeNative().native_fn(None, 1.0, [(x, x, x)]), "fake", repeats=3, warmup=1)
    assert rec["timer"] in ("cupti", "cuda_events") and rec["runtime_peak_bytes"] == 123
    assert rec["runtime_peak_scope"] == "fake" and rec["wall_n"] == 3 and rec["kernel_n"] == 3
    assert rec["pipelined_ms"] == pytest.approx(2.0) and rec["wall_ms"] == pytest.approx(2.0)
    assert rec["compile_s"] == pytest.approx(0.002)
    if rec["timer"] == "cuda_events":
        assert rec["kernel_ms"] == pytest.approx(2.0)
    assert calls and FakeNative().available() is None


def test_registered_plugs_a_backend_in_for_a_block_and_restores_the_registry():
    class Toy(Backend):
        name = "test-toy-block"

        def run(self, p):
            return backends.get("naive").run(p)

    before, order = backends.names(), list(backends.AUTO_ORDER)
    naive = backends.get("naive")
    replacement = type("Naive2", (Backend,), {"name": "naive", "run": lambda self, p: None})()
    with backends.registered(Toy(), replacement) as (toy, _):
        assert backends.get("test-toy-block") is toy and backends.get("naive") is replacement
        backends.register(type("Ranked", (Toy,), {"name": "test-toy-ranked"})(), auto_rank=0)  # inside the block
    assert backends.names() == before and backends.AUTO_ORDER == order and backends.get("naive") is naive
    with pytest.raises(RuntimeError), backends.registered(Toy()):
        raise RuntimeError("a failing test body")
    assert "test-toy-block" not in backends.names()


def test_unregister_removes_a_backend_and_its_auto_rank():
    class Toy(Backend):
        name = "test-toy-gone"

        def run(self, p):
            return backends.get("naive").run(p)

    backends.register(Toy(), auto_rank=0)
    assert backends.AUTO_ORDER[0] == "test-toy-gone"
    assert backends.unregister("test-toy-gone").name == "test-toy-gone"
    assert "test-toy-gone" not in backends.names() and "test-toy-gone" not in backends.AUTO_ORDER
    with pytest.raises(ValueError, match="test-toy-gone"):
        backends.unregister("test-toy-gone")
