"""The measurement engine on the CPU: timers, statuses, modes, metrics, ceilings."""
import re
import threading

import jax
import jax.numpy as jnp
import pytest

from attnlab import backends
from attnlab.measure import Cell, Options, Stats, kernel_timer_available, measure_cell, peaks, timers

SMALL = dict(batch=1, q_len=32, kv_len=32, heads=4, kv_heads=2, head_dim=16)
FAST = Options(repeats=3, warmup=1, pipelined_calls=3, max_input_sets=2)


def cell(backend="naive", **kw):
    return Cell(backend, **{**SMALL, "dtype": "float32", **kw})




def test_stats():
    s = Stats.of([1, 2, 3, 4, 100])
    assert s.median == 3 and s.min == 1 and s.max == 100 and s.n == 5 and s.iqr == 2


def test_timers_on_cpu():
    assert "wall clock" in kernel_timer_available()
    f = lambda x: jnp.sin(x) @ x  # noqa: E731
    x = jax.random.normal(jax.random.key(0), (64, 64))
    compiled, lower_s, compile_s = timers.compile_seconds(f, (x,))
    assert lower_s > 0 and compile_s > 0
    w = timers.wall_per_call(compiled, [(x,), (x + 1,)], 4)
    p = timers.wall_pipelined(compiled, [(x,)], 5, rounds=2)
    assert w.n == 4 and w.median > 0 and p.n == 2 and p.median > 0


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd", "bwd"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ok_cell_record(mode, dtype):
    r = measure_cell(cell("xla", mode=mode, dtype=dtype, causal=True), FAST)
    assert r["status"] == "ok", r["reason"]
    assert r["timer"] == "wall" and r["kernel_ms"] is None and r["wall_ms"] > 0 and r["pipelined_ms"] > 0
    assert r["compile_s"] > 0 and r["tflops"] > 0 and r["gbps"] > 0
    assert r["rel_err"] < 1e-2 and r["temp_bytes"] is not None and r["peak_bytes"] > 0
    assert r["pct_peak"] is None  # no datasheet entry for a CPU
    if mode != "fwd":
        assert r["grad_check"] == "ok" and r["grad_checked_fraction"] == 1.0
        assert set(r["grad_checks"]) == {"dq", "dk", "dv"}
    for k in ("backend", "batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "dtype", "causal", "window",
              "mode", "status", "reason", "kernel_ms", "wall_ms", "compile_s", "tflops", "gbps", "pct_peak", "rel_err",
              "max_abs_err", "temp_bytes", "peak_bytes"):
        assert k in r


def test_large_cell_is_checked_whole_and_on_float64_rows():
    r = measure_cell(cell("xla", batch=3, q_len=600, kv_len=600, causal=True, window=(64, 0)), FAST)
    assert r["status"] == "ok" and r["checked_fraction"] == 1.0
    dev, f64 = r["checks"]["float32_device"], r["checks"]["float64_rows"]
    assert dev["fraction"] == 1.0 and dev["ok"] and f64["ok"]
    assert f64["batch"] == [0, 1, 2] and 4 * 64 >= f64["rows"] > 2 * 64   # edges + interior tiles
    assert r["margin"] >= 1 and r["rel_err"] <= dev["limit"]


def test_unsupported():
    r = measure_cell(cell("cudnn", dtype="bfloat16"), FAST)
    assert r["status"] == "unsupported" and "GPU" in r["reason"] and r["wall_ms"] is None


def test_oom_predicted_from_compiled_memory():
    r = measure_cell(cell("naive"), Options(max_bytes=1000, repeats=2))
    assert r["status"] == "oom" and "compiled peak" in r["reason"]
    # a serving step too (it ran past the limit without a word)
    step = Cell("xla", 3, 1, 32, 2, 1, 8, "float32", True, lengths="one-long")
    r = measure_cell(step, Options(max_bytes=1000, repeats=2))
    assert r["status"] == "oom" and "compiled peak" in r["reason"] and r["wall_ms"] is None


def test_oom_raised_while_running(fake_backend):
    def run(p):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 99999999 bytes")

    r = measure_cell(cell(fake_backend("fake-oom", run)), FAST)
    assert r["status"] == "oom" and "RESOURCE_EXHAUSTED" in r["reason"]


def test_compile_error(fake_backend):
    def run(p):
        return p.query @ p.key[:, :3]  # (.., N, H) @ (.., K, H): shapes do not contract

    r = measure_cell(cell(fake_backend("fake-compile", run)), FAST)
    assert r["status"] == "compile_error" and r["reason"]


def test_runtime_error(fake_backend):
    def boom(x):
        raise RuntimeError("kernel exploded")

    def run(p):
        return jax.pure_callback(boom, jax.ShapeDtypeStruct(p.query.shape, p.query.dtype), p.query)

    r = measure_cell(cell(fake_backend("fake-runtime", run)), FAST)
    assert r["status"] == "runtime_error" and "exploded" in r["reason"]


def test_over_budget_compile_is_skipped(fake_backend):
    """Tracing blocks until the test releases it, after measure_cell has returned: only a watchdog
    that abandons the compile lets measure_cell return first (no clock is read)."""
    release, traced = threading.Event(), threading.Event()

    def run(p):
        release.wait(30)  # tracing takes "forever": until released
        traced.set()
        return backends.get("naive").run(p)

    try:
        r = measure_cell(cell(fake_backend("fake-slow", run)), Options(compile_budget_s=0.5, repeats=2))
        assert not traced.is_set(), "measure_cell waited for the compile instead of abandoning it"
        assert r["status"] == "over_budget" and "budget" in r["reason"]
    finally:
        release.set()


def test_incorrect_is_never_timed(fake_backend):
    r = measure_cell(cell(fake_backend("fake-wrong", lambda p: backends.get("naive").run(p) * 1.01)), FAST)
    assert r["status"] == "incorrect" and r["rel_err"] > 1e-3
    assert r["wall_ms"] is None and r["tflops"] is None


def test_nan_is_incorrect(fake_backend):
    r = measure_cell(cell(fake_backend("fake-nan", lambda p: backends.get("naive").run(p) * jnp.nan)), FAST)
    assert r["status"] == "incorrect"


def test_peak_table():
    assert peaks.peak_for_kind("NVIDIA H200").hbm_tbps == 4.8
    assert peaks.peak_for_kind("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert peaks.peak_for_kind("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert peaks.peak_for_kind("NVIDIA A100-SXM4-40GB").name == "A100 40GB"
    assert peaks.peak_for_kind("NVIDIA L4").name == "L4"
    assert peaks.peak_for_kind("cpu") is None
    assert peaks.peak_tflops("NVIDIA H200", "bfloat16") == 989.4
    assert peaks.peak_tflops("NVIDIA H200", "float32", tf32=True) == 494.7
    for p in peaks.PEAKS.values():
        assert "datasheet" in p.source


def test_ceilings_measured_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    res = peaks.measure_ceilings(matmul_n=128, copy_bytes=2**20, repeats=2)
    assert res["timer"] == "wall" and res["matmul_tflops"] > 0 and res["copy_gbps"] > 0
    peaks.save_ceilings(res)
    assert peaks.load_ceilings(res["device_kind"])["matmul_n"] == 128


def test_random_inputs_are_bit_identical_to_jax_random_normal():
    """inputs._normal cuts small tensors from one bucketed draw (one compile per bucket, issue 12
    item 12): the values must be exactly jax.random.normal's."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from attnlab.reference.inputs import _normal, random_qkv

    for shape in [(2, 64, 4, 32), (1, 3, 5, 7)]:
        key = jax.random.key(11)
        assert np.array_equal(np.asarray(_normal(key, shape)), np.asarray(jax.random.normal(key, shape, jnp.float32)))
    q, k, v = random_qkv(1, 3, 7, 5, 5, 1, "bfloat16", seed=5)     # k and v are (1, 7, 5, 1): 35 values
    kq, kk, kv = jax.random.split(jax.random.key(5), 3)
    assert np.array_equal(np.asarray(k), np.asarray(jax.random.normal(kk, (1, 7, 5, 1), jnp.float32).astype("bfloat16")))
    assert q.shape == (1, 3, 5, 1) and v.shape == (1, 7, 5, 1)


@pytest.mark.parametrize("factor, status", [(1.0, "ok"), (1.01, "incorrect")])
def test_native_cell_checked_once_then_timed(factor, status):
    """A backend outside JAX (``NativeBackend``) goes through measure_cell as any cell: its kernel built once
    (``native_fn``), its output (handed to JAX by its ``to_jax`` hook) checked (``check``), then, only when right,
    the same kernel timed by ``measure.native`` (device events here)."""
    import time

    import numpy as np

    import attnlab
    from attnlab.backends.base import NativeBackend, NativeCall

    launched, built, first = [], [], []

    class FakeNative(NativeBackend):
        name = "test-fake-native"

        def native_fn(self, spec, scale, arg_sets, decode=None):
            built.append(spec)

            def fn(q, k, v):     # the output of the first set, computed once (the timed calls are many)
                launched.append(q.shape)
                if len(launched) == 1:     # (B, N, T, H), as a library's own layout: ``to_jax`` gives it back
                    first.append(np.asarray(attnlab.attention(q, k, v, is_causal=spec.is_causal, scale=scale,
                                                              implementation="naive")).transpose(0, 2, 1, 3) * factor)
                return first[0]

            def event_ms(call):
                t0 = time.perf_counter()
                call()
                return (time.perf_counter() - t0) * 1e3
            return NativeCall(fn, lambda: None, [tuple(np.asarray(x) for x in s) for s in arg_sets],
                              {"event_ms": event_ms, "to_jax": lambda out: jnp.asarray(out.transpose(0, 2, 1, 3))})

    with backends.registered(FakeNative()):
        r = measure_cell(cell("test-fake-native"), FAST)
    assert r["status"] == status, r["reason"]
    assert len(built) == 1 and r["rel_err"] is not None
    assert (len(launched) > 1) == (status == "ok")      # the output's call, then, only when right, the timed ones
    assert (r["wall_ms"] is not None) == (status == "ok") and (r["kernel_ms"] is not None) == (status == "ok")


@pytest.mark.parametrize("declared, fields, reason", [
    (dict(decode=False), {}, "no decode (cache) semantics"),
    (dict(decode=True, decode_reason=lambda self, n, T, S: "ragged caches"), {}, "ragged caches"),
    (dict(decode=True), dict(sinks=True), "sinks: no attention sinks"),
    (dict(decode=True), dict(kv_dtype="int8"), "k_scale/v_scale: no quantized KV cache")])
def test_a_native_backend_refuses_the_decode_cells_it_cannot_run(declared, fields, reason):
    """Asked once with the cell's call (``inputs.cell_inputs``): decode semantics, scales, lengths, sinks."""
    from attnlab.backends.base import NativeBackend

    fake = type("FakeNativeDecode", (NativeBackend,), {"name": "test-fake-native-decode",
                                                       "decode_reason": lambda self, n, T, S: None, **declared})
    with backends.registered(fake()):
        r = measure_cell(cell("test-fake-native-decode", lengths="full", **fields), FAST)
    assert r["status"] == "unsupported" and r["reason"].startswith(f"test-fake-native-decode: {reason}"), r["reason"]


def test_input_sets_rotate_past_l2_within_their_bounds():
    """One rule for every kind of cell (the dense, the serving cell and the estimate): sets of ``set_bytes`` until
    3 x L2 (or ``rotate_bytes``) is passed, at most ``max_input_sets`` and 4 GiB, at least one."""
    o = Options(max_input_sets=8)
    assert o.input_sets(10 * 2**20, 50 * 2**20) == 8           # 150 MiB of L2 rotation: capped at 8 sets
    assert o.input_sets(40 * 2**20, 50 * 2**20) == 4           # ceil(150 / 40)
    assert o.input_sets(40 * 2**20, None) == 5                 # unknown L2: 3 x 64 MiB
    assert o.input_sets(3 * 2**30, 50 * 2**20) == 1            # 4 GiB holds one set only
    assert Options(rotate_bytes=0).input_sets(2**20, 50 * 2**20) == 1
    assert Options(rotate_bytes=5 * 2**20).input_sets(2**20, 50 * 2**20) == 5


@pytest.mark.parametrize("shape, dtype, match", [((5, 4, 16), "float32", None),
                                                 ((5, 4, 16), "bfloat16", r"bfloat16 \(5, 4, 16\) is not"),
                                                 ((6, 4, 16), "float32", r"float32 \(6, 4, 16\) is not")])
def test_every_cells_output_dtype_is_checked_first_a_serving_steps_shape_too(shape, dtype, match):
    """check.check_into judges the output's dtype (a serving step's: and its packed shape) before any reference."""
    import types

    from attnlab.measure import check
    from attnlab.measure.outcome import Skip

    cell = Cell("xla", 2, 2, 64, 4, 2, 16, "float32", True, lengths="spread")
    q = jnp.zeros((5, 4, 16), jnp.float32)         # the step's packed query rows
    run = types.SimpleNamespace(output=lambda: jnp.zeros(shape, dtype), contiguous=(q,))
    with pytest.raises(Skip) as e:    # a right output goes on to its requests, which this stub run lacks
        check.check_into({}, run, cell, backends.get("xla"), Options())
    assert (e.value.status == "incorrect") == (match is not None), e.value.reason
    assert match is None or re.search(match, e.value.reason) and e.value.fields == {"out_dtype": dtype}


def test_the_commit_is_of_attnlab_s_own_checkout_not_a_project_around_an_installed_copy(tmp_path, monkeypatch):
    """An installed copy (a wheel in a project's virtual environment) sits inside the project's repository
    but is not tracked there: its records name no commit rather than the project's."""
    import subprocess

    from attnlab.measure.env import git_commit

    monkeypatch.delenv("ATTNLAB_GIT_COMMIT", raising=False)
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *a],  # noqa: E731
                                    check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "the project")
    copy = tmp_path / ".venv" / "attnlab" / "env.py"
    copy.parent.mkdir(parents=True)
    copy.write_text("")
    assert git_commit(str(copy)) is None
    git("add", "-f", str(copy))
    git("commit", "-q", "-m", "tracked")
    assert git_commit(str(copy)) == git("describe", "--always", "--abbrev=7")
