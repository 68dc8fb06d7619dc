"""Issue 11: every record tells the truth.

The blockwise float32 device reference calibrated against float64; the whole output and every
gradient checked; mutants caught and never timed; the record schema and its invariants.
"""
import glob
import json
import math
import os
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnlab import backends
from attnlab.reference.inputs import random_qkv
from attnlab.measure import Cell, Options, measure_cell
from attnlab.measure import cell as cellmod
from attnlab.measure import check
from attnlab.core.records import RecordError, upgrade, validate
from attnlab.reference.float64 import reference_attention, reference_attention_grads, rel_l2
from attnlab.reference.blockwise import blockwise_attention, blockwise_grads, tile_rows
from attnlab.reference import compiled
from attnlab.reference.inputs import seed_of
from attnlab.reference.output_errors import sample_rows
from attnlab.core.store import ResultStore, read_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = Options(repeats=2, warmup=1, pipelined_calls=2, max_input_sets=1)

CALIBRATION = [  # (B, T, S, N, K, H, causal, window, tile)
    (2, 37, 29, 4, 2, 16, False, None, 8),     # T not a multiple of the tile, GQA
    (2, 40, 40, 4, 1, 8, True, None, 16),      # MQA, causal
    (1, 33, 50, 2, 2, 8, True, (5, 0), 8),     # causal window, T != S
    (2, 20, 20, 4, 4, 8, False, (3, 2), 7),    # two-sided window, odd tile
    (3, 1, 64, 8, 2, 16, False, None, None),   # one query row
]


@pytest.mark.parametrize("B,T,S,N,K,H,causal,window,tile", CALIBRATION)
def test_blockwise_reference_matches_float64(B, T, S, N, K, H, causal, window, tile):
    q, k, v = random_qkv(B, T, S, N, K, H, "float32", seed=1)
    out = blockwise_attention(q, k, v, causal=causal, window=window, tile=tile)
    ref = reference_attention(q, k, v, is_causal=causal, local_window_size=window)
    assert out.dtype == jnp.float32 and rel_l2(out, ref) < 1e-6
    ct = jax.random.normal(jax.random.key(3), q.shape)
    grads = blockwise_grads(q, k, v, ct, causal=causal, window=window, tile=tile)
    refs = reference_attention_grads(q, k, v, ct, is_causal=causal, local_window_size=window)
    for g, r in zip(grads, refs):
        assert g.shape == r.shape and rel_l2(g, r) < 1e-6


def test_blockwise_reference_lengths_and_positions_match_float64():
    q, k, v = random_qkv(3, 6, 40, 4, 2, 8, "float32", seed=2)
    kv = np.array([40, 17, 6])
    offsets = kv - 6                                   # decode: the 6 queries are the last 6 tokens
    pos = offsets[:, None] + np.arange(6)[None]
    out = blockwise_attention(q, k, v, causal=True, kv_lengths=jnp.asarray(kv), q_positions=jnp.asarray(pos), tile=4)
    ref = reference_attention(q, k, v, is_causal=True, key_value_seq_lengths=kv, query_positions=pos)
    assert rel_l2(out, ref) < 1e-6
    ql = jnp.asarray([6, 2, 0])
    out = blockwise_attention(q, k, v, kv_lengths=jnp.asarray(kv), q_lengths=ql)
    ref = reference_attention(q, k, v, key_value_seq_lengths=kv, query_seq_lengths=ql)
    assert rel_l2(out, ref) < 1e-6 and np.all(np.asarray(out)[2] == 0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_device_emulation_is_the_documented_kernel_like_computation(dtype):
    q, k, v = random_qkv(2, 24, 24, 4, 2, 16, dtype, seed=4)
    emu = blockwise_attention(q, k, v, causal=True, emulate=True, tile=8)
    np_emu = reference_attention(q, k, v, is_causal=True, emulate=dtype)
    ref = reference_attention(q, k, v, is_causal=True)
    assert emu.dtype == q.dtype
    assert rel_l2(emu, np_emu) < 0.05 * rel_l2(np_emu, ref)   # the same rounding, step for step (XLA's division
    # may round a few values 1 ulp apart: JAX 0.12.1 divides float32 exactly under jit on the CPU, 0.10.2 did not)
    lo = {"bfloat16": 5e-4, "float16": 5e-5}[dtype]
    assert lo < rel_l2(emu, ref) < 20 * lo                     # and it does lose the dtype's precision


def test_tile_rows_respects_the_memory_budget():
    assert tile_rows(1, 16384, 16, 16384, budget=256 * 2**20) == 256
    assert tile_rows(1, 100, 4, 100, budget=2**30) == 100
    assert tile_rows(64, 16384, 64, 131072, budget=2**20) == 1


def test_sample_rows_are_seeded_by_the_problem_not_by_python_hash():
    assert seed_of("problem") == seed_of("problem") == 1201967958
    b, rows = sample_rows(seed_of("x"), 8, 1000)
    assert b[0] == 0 and b[-1] == 7 and len(b) == 3
    assert {0, 63, 936, 999} <= set(rows.tolist()) and 128 < rows.size <= 256
    assert sample_rows(seed_of("x"), 8, 1000)[1].tolist() == rows.tolist()


# --- mutants: each one is caught as incorrect and never timed -------------------------------

def _corrupt_row(p, out):
    B, T = out.shape[:2]
    return out.at[B - 1, T // 2].multiply(1.1)


def _corrupt_tile(p, out):
    return out.at[0, 64:128].multiply(1.1)


def _make_forward_mutant(name, corrupt):
    naive = backends.get("naive")
    return type(name, (backends.Backend,), {"name": name, "run": lambda self, p: corrupt(p, naive.run(p))})()


def _dk_too_large(dq, dk, dv):
    return dq, (dk * 1.1).astype(dk.dtype), dv


def _dq_row_short(dq, dk, dv):
    """One query row of dq 20% short: under the whole tensor's rel L2 limit in bf16, not under the row rule."""
    return dq.at[1, 100].multiply(0.8), dk, dv


def _make_grad_mutant(name, wrong=_dk_too_large):
    """Forward right; the gradients made ``wrong``."""
    naive = backends.get("naive")

    class GradMutant(backends.Backend):
        def run(self, p):
            @jax.custom_vjp
            def f(q, k, v):
                return naive.run(_with(p, q, k, v))

            def f_fwd(q, k, v):
                out, vjp = jax.vjp(lambda a, b, c: naive.run(_with(p, a, b, c)), q, k, v)
                return out, vjp

            def f_bwd(vjp, ct):
                return wrong(*vjp(ct))

            f.defvjp(f_fwd, f_bwd)
            return f(p.query, p.key, p.value)

    b = GradMutant()
    b.name = name
    return b


def _with(p, q, k, v):
    import dataclasses

    return dataclasses.replace(p, query=q, key=k, value=v)


@pytest.fixture
def registered():
    names = []

    def add(b):
        backends.register(b)
        names.append(b.name)
        return b.name

    yield add
    for n in names:
        backends.unregister(n)


MUTANT_SHAPE = dict(batch=4, q_len=256, kv_len=256, heads=4, kv_heads=2, head_dim=32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mutant", ["row", "tile", "dk", "dq-row"])
def test_mutants_are_incorrect_and_never_timed(registered, dtype, mutant):
    if mutant in ("dk", "dq-row"):
        name = registered(_make_grad_mutant(f"mutant-{mutant}-{dtype}", {"dk": _dk_too_large, "dq-row": _dq_row_short}[mutant]))
        mode = "fwd+bwd"
    else:
        name = registered(_make_forward_mutant(f"mutant-{mutant}-{dtype}", {"row": _corrupt_row, "tile": _corrupt_tile}[mutant]))
        mode = "fwd"
    r = measure_cell(Cell(name, **MUTANT_SHAPE, dtype=dtype, causal=True, mode=mode), FAST)
    assert r["status"] == "incorrect", (r["status"], r["reason"])
    assert all(r[f] is None for f in ("kernel_ms", "wall_ms", "pipelined_ms", "tflops", "gbps")) and "repeats" not in r
    if mutant == "dk":
        assert r["grad_checks"]["dk"]["ok"] is False and r["grad_checks"]["dq"]["ok"] and r["grad_checks"]["dv"]["ok"]
        assert "dk" in r["reason"]
    elif mutant == "dq-row":
        dq = r["grad_checks"]["dq"]
        assert not dq["ok"] and dq["row_err"] > dq["row_limit"] and "dq" in r["reason"], r["reason"]
        if dtype == "bfloat16":
            assert dq["rel_err"] <= dq["limit"]     # the whole tensor's norm averages the row away; its row does not
    else:
        assert r["checks"]["float32_device"]["ok"] is False and "whole output" in r["reason"]
    validate(r)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd", "bwd"])
def test_a_clean_backend_passes_with_margin_recorded(registered, dtype, mode):
    name = registered(_make_forward_mutant(f"clean-{dtype}-{mode}", lambda p, out: out))
    r = measure_cell(Cell(name, **MUTANT_SHAPE, dtype=dtype, causal=True, mode=mode), FAST)
    assert r["status"] == "ok", r["reason"]
    assert r["checked_fraction"] == 1.0 and r["margin"] >= 1 and r["wall_ms"] > 0
    assert set(r["checks"]) == {"float32_device", "float64_rows"}
    if mode != "fwd":
        assert r["grad_check"] == "ok" and r["grad_checked_fraction"] == 1.0 and r["grad_margin"] >= 1
    validate(r)


def _programs_run(monkeypatch) -> Counter:
    """How many times the check ran each reference program (by name) and the float64 reference ("float64")."""
    from attnlab.reference import output_errors as oe

    runs: Counter = Counter()
    real, real64 = oe.compiled_once, oe.reference_attention
    monkeypatch.setattr(oe, "compiled_once", lambda p, *a, **kw: runs.update([p.__name__]) or real(p, *a, **kw))
    monkeypatch.setattr(oe, "reference_attention", lambda *a, **kw: runs.update(["float64"]) or real64(*a, **kw))
    return runs


def test_references_are_shared_by_backends_of_one_problem(monkeypatch):
    runs = _programs_run(monkeypatch)
    compiled.clear_results()
    for b in ("naive", "xla"):
        assert measure_cell(Cell(b, 1, 64, 64, 2, 2, 16, "float32", True), FAST)["status"] == "ok"
    # the reference and its emulation (one program), once for both backends; judged: the emulation, each output
    assert runs["references"] == 1 and runs["judge_output"] == 3


def test_fwd_bwd_cells_of_one_problem_share_forward_rows_and_grad_references(monkeypatch):
    """A fwd+bwd cell needs three references (forward, float64 rows, gradients): all three stay cached
    for the next backend (a 2-entry cache of single references used to evict each one before its reuse)."""
    runs = _programs_run(monkeypatch)
    compiled.clear_results()
    for b in ("naive", "xla", "naive"):
        r = measure_cell(Cell(b, 1, 64, 64, 2, 2, 16, "float32", True, mode="fwd+bwd"), FAST)
        assert r["status"] == "ok" and r["check_s"] > 0
    assert (runs["references"], runs["grad_references"], runs["float64"]) == (1, 1, 1)


# --- records: a typed schema with invariants --------------------------------------------------

def _ok_record():
    return measure_cell(Cell("naive", 1, 32, 32, 2, 2, 8, "float32"), FAST).flat()   # as on disk


@pytest.mark.parametrize("change,field", [
    ({"timer": None}, "timer"),
    ({"timer": "wall", "wall_ms": None}, "wall_ms"),
    ({"checked_fraction": None}, "checked_fraction"),
    ({"checks": None}, "checks"),
    ({"status": "incorrect", "reason": "x"}, "kernel_ms"),
    ({"status": "unsupported", "reason": None, "wall_ms": None, "pipelined_ms": None, "tflops": None, "gbps": None}, "reason"),
    ({"status": "fine"}, "status"),
    ({"batch": "1"}, "batch"),
    ({"reason": "why"}, "reason"),
    ({"mode": "fwd+bwd", "grad_check": None}, "grad_check"),
])
def test_schema_invariants(change, field):
    rec = _ok_record()
    validate(rec)
    bad = {**rec, **change}
    if bad["status"] == "incorrect":
        bad.update(wall_ms=None, pipelined_ms=None, tflops=None, gbps=None, kernel_ms=1.0)
    with pytest.raises(RecordError) as e:
        validate(bad)
    assert e.value.field == field


def test_store_refuses_a_record_that_breaks_the_schema(tmp_path):
    store = ResultStore(tmp_path / "r.jsonl")
    rec = _ok_record()
    store.append(rec)
    with pytest.raises(RecordError, match="never timed"):
        store.append({**rec, "status": "incorrect", "reason": "wrong"})
    assert len(read_records(tmp_path / "r.jsonl")) == 1


def test_every_committed_results_file_still_loads():
    files = glob.glob(os.path.join(ROOT, "results", "**", "*.jsonl"), recursive=True)
    assert files
    for f in files:
        recs = read_records(f)
        cells = [r for r in recs if r.get("kind", "cell") == "cell" and "backend" in r]
        for r in cells:
            assert "runtime_peak_bytes" not in r or r.get("schema") == 2


def test_legacy_records_are_upgraded_and_marked():
    old = {"backend": "xla", "batch": 4, "q_len": 1024, "kv_len": 1024, "heads": 8, "kv_heads": 8, "head_dim": 64,
           "dtype": "bfloat16", "causal": False, "window": None, "mode": "fwd+bwd", "status": "ok", "reason": None,
           "timer": "cupti", "kernel_ms": 1.0, "rel_err": 0.002, "checked_rows": 256, "runtime_peak_bytes": 7,
           "grad_check": "skipped: too large for the float64 reference"}
    new = upgrade(old)
    assert new["schema"] == 1 and new["process_peak_bytes"] == 7 and "runtime_peak_bytes" not in new
    assert new["checked_fraction"] == pytest.approx(256 * 2 / (4 * 1024)) and new["grad_checked_fraction"] == 0.0
    validate(new)


def test_fp8_cells_are_judged_against_the_fp8_peak():
    class Info:
        kind = "NVIDIA H200"

    fp8 = type("F", (), {"compute_dtype": "float8_e4m3fn"})()
    times = {"kernel_ms": 1.0, "wall_ms": 1.1, "flops": 1e12, "bytes": 1e9}
    rec = cellmod.rates(times, Cell("naive", 1, 8, 8, 1, 1, 8, "bfloat16"), Info(), fp8)
    assert rec["peak_tflops"] == 1978.9 and rec["peak_dtype"] == "fp8" and math.isclose(rec["pct_peak"], 100 * 1000 / 1978.9)
    assert cellmod.rates(times, Cell("naive", 1, 8, 8, 1, 1, 8, "bfloat16"), Info(), None)["peak_tflops"] == 989.4


def test_unchecked_cells_say_so():
    r = measure_cell(Cell("naive", 1, 32, 32, 2, 2, 8, "float32"), Options(repeats=2, check=False))
    assert r["status"] == "unchecked" and r["checked_fraction"] is None and r["wall_ms"] > 0
    validate(r)


def test_process_peak_is_named_for_what_it_is():
    r = _ok_record()
    assert "process_peak_bytes" in r and "runtime_peak_bytes" not in r


def test_torch_cupti_timer_fails_loudly_without_cupti():
    from attnlab.measure.timers import cupti_per_call

    if jax.default_backend() == "gpu":
        pytest.skip("CUPTI exists here")
    with pytest.raises((RuntimeError, ImportError, AttributeError)):
        cupti_per_call(lambda: None, [()], 2, lambda: None)


def test_a_results_file_line_breaking_the_schema_names_line_and_field(tmp_path):
    p = tmp_path / "results.jsonl"
    good = _ok_record()
    p.write_text(json.dumps(good) + "\n" + json.dumps({**good, "status": "ok", "timer": "sundial"}) + "\n")
    with pytest.raises(RecordError, match="record 2: record field 'timer'"):
        read_records(p)


def test_reference_cache_keeps_recent_inputs_within_its_byte_cap(monkeypatch):
    import numpy as np

    compiled.clear_results()
    monkeypatch.setattr(compiled, "RESULTS_BYTES", 2500)
    for i in range(4):   # 1 KB each: the cap keeps the newest 2 (3 would pass it)
        compiled.computed_once(("fwd", f"k{i}"), lambda: np.zeros(125))
        compiled.computed_once(("f64", f"k{i}"), lambda: np.zeros(0))
    assert list(compiled._RESULTS) == ["k2", "k3"] and set(compiled._RESULTS["k3"]) == {"fwd", "f64"}
    monkeypatch.setattr(compiled, "RESULTS_BYTES", 10)
    compiled.computed_once(("fwd", "big"), lambda: np.zeros(1000))   # over the cap alone: still kept
    assert list(compiled._RESULTS) == ["big"]
    compiled.clear_results()


def test_reference_programs_are_compiled_once_per_shape_without_autotuning(monkeypatch):
    """The float32 reference + emulation program compiles once per (shape, static options) and is reused;
    it is compiled with XLA's GPU autotuner off (a reference runs once a shape: autotuning only costs)."""
    from collections import OrderedDict

    from attnlab.reference import compiled
    from attnlab.reference.check_programs import references
    from attnlab.reference.inputs import random_qkv

    options = []

    class Spy:
        def __init__(self, lowered):
            self.lowered = lowered

        def compile(self, compiler_options=None):
            options.append(compiler_options)
            return self.lowered.compile(compiler_options=compiler_options)

    program = type("P", (), {"__name__": "references",
                             "lower": staticmethod(lambda *a, **k: Spy(references.lower(*a, **k)))})()
    monkeypatch.setattr(compiled, "_PROGRAMS", OrderedDict())
    q, k, v = random_qkv(1, 32, 32, 2, 2, 16, "float32", seed=0)
    for causal in (True, True, False):
        compiled.compiled_once(program, q, k, v, causal=causal)
    assert options == [compiled.NO_AUTOTUNE] * 2 and compiled.NO_AUTOTUNE == {"xla_gpu_autotune_level": 0}


def test_float64_reference_is_the_same_over_blocks_of_keys(monkeypatch):
    """K and V are made float64 a block of keys at a time (a long cache is never whole in float64):
    with blocks of 16 keys the reference and its bf16 emulation equal the one-block result."""
    from attnlab.reference import float64 as f64
    from attnlab.reference import keyblocks

    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 5, 4, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, 70, 2, 8)).astype(np.float32) for _ in range(2))
    kw = dict(is_causal=True, query_positions=np.arange(65, 70), logits_soft_cap=5.0)
    whole = [f64.reference_attention(q, k, v, **kw), f64.reference_attention(q, k, v, emulate="bfloat16", **kw)]
    monkeypatch.setattr(keyblocks, "KEY_BLOCK", 16)    # 70 keys: five blocks, the last one short
    blocks = [f64.reference_attention(q, k, v, **kw), f64.reference_attention(q, k, v, emulate="bfloat16", **kw)]
    for a, b in zip(whole, blocks):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_a_cell_records_what_its_references_cost():
    """``check_parts_s``: the first backend of a problem pays the float32 reference and the float64 rows;
    the next one on the same inputs finds both made."""
    from attnlab.measure.cell import Cell, Options, measure_cell

    compiled.clear_results()
    fast = Options(repeats=1, warmup=0, min_time_s=0.0)
    first, second = (measure_cell(Cell(b, 1, 64, 64, 2, 2, 16, "float32", True), fast) for b in ("naive", "xla"))
    assert first["status"] == second["status"] == "ok"
    assert set(first["check_parts_s"]) == {"reference_s", "float64_rows_s"}
    assert all(s > 0 for s in first["check_parts_s"].values()) and second["check_parts_s"] is None


def test_the_emulation_rounds_p_to_the_querys_dtype_beside_a_float32_cache():
    """A bfloat16 query over a float32 cache (a dequantized one): the kernel-like emulation (the tolerance's
    baseline) rounds P to bfloat16 as the kernel does; a float32 cache of bfloat16 values emulates exactly as the
    bfloat16 cache does."""
    q, k, v = (x.astype(jnp.bfloat16) for x in random_qkv(2, 16, 64, 4, 2, 32, "float32", seed=5))
    as_bf16 = blockwise_attention(q, k, v, emulate=True)
    as_f32 = blockwise_attention(q, k.astype(jnp.float32), v.astype(jnp.float32), emulate=True)
    assert as_f32.dtype == jnp.bfloat16 and np.array_equal(np.asarray(as_f32), np.asarray(as_bf16))
    s = jnp.einsum("brkgh,bskh->bkgrs", q.reshape(2, 16, 2, 2, 32), k, preferred_element_type=jnp.float32) / np.sqrt(32)
    by_hand = jnp.einsum("bkgrs,bskh->brkgh", jax.nn.softmax(s, axis=-1).astype(jnp.bfloat16), v,
                         preferred_element_type=jnp.float32).reshape(q.shape).astype(jnp.bfloat16)   # P in bf16
    assert np.array_equal(np.asarray(as_f32), np.asarray(by_hand))
