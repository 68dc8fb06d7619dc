"""Decode attention (issue 13): semantics, validation, every CPU path and the Pallas kernel in interpret mode.

Kernel shapes stay small: interpret mode runs the grid program by program.
"""
import os
import functools
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnlab
from attnlab import backends
from attnlab.backends import attnlab_decode
from attnlab.api.decode import decode_mask, prepare_decode
from attnlab.core.errors import UnsupportedError
from attnlab.reference.inputs import random_qkv
from attnlab.kernels import decode as kd
from attnlab.reference.float64 import reference_attention
from attnlab.reference.decode64 import check_decode_close, decode_visible, reference_decode_attention

KERNEL = "attnlab-decode"


def assert_close(out, q, k, v, lengths, *, causal=True, scale=None):
    """The one place the decode tolerance policy is applied in these tests."""
    assert out.shape == q.shape and out.dtype == q.dtype
    verdict = check_decode_close(out, q, k, v, lengths, causal=causal, scale=scale)
    assert verdict.ok, verdict


def kernel(q, k, v, lengths, causal=True, scale=None, **cfg):
    """The kernel directly, with explicit tuning parameters (to reach several splits / row tiles)."""
    return kd.decode_attention_pallas(q, k, v, jnp.asarray(lengths), causal=causal, scale=scale,
                                      config=kd.DecodeConfig(**cfg) if cfg else None, interpret=True)


# ---------------------------------------------------------------- the reference itself

@pytest.mark.parametrize("causal", [True, False])
def test_reference_equals_attention_reference_with_the_explicit_rule(causal):
    q, k, v = random_qkv(3, 4, 20, 4, 2, 8, "float32", seed=2)
    lengths = np.array([20, 4, 11])
    mask = decode_visible(lengths, 4, 20, causal)[:, None]          # (B, 1, T, S)
    want = reference_attention(q, k, v, mask=mask)
    got = reference_decode_attention(q, k, v, lengths, causal=causal)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_reference_causal_full_cache_is_bottom_right_causal():
    q, k, v = random_qkv(2, 6, 6, 2, 1, 8, "float32", seed=3)
    got = reference_decode_attention(q, k, v, np.array([6, 6]), causal=True)
    np.testing.assert_allclose(got, reference_attention(q, k, v, is_causal=True), rtol=1e-12, atol=1e-12)
    # T = 1: causal and non-causal agree (query at the last valid position sees every valid key)
    q1 = q[:, :1]
    np.testing.assert_allclose(reference_decode_attention(q1, k, v, np.array([6, 3]), causal=True),
                               reference_decode_attention(q1, k, v, np.array([6, 3]), causal=False))


def test_decode_mask_matches_reference_rule():
    lengths = np.array([9, 3, 5])
    got = np.asarray(decode_mask(jnp.asarray(lengths), 3, 9))[:, 0]
    assert got.shape == (3, 3, 9)
    np.testing.assert_array_equal(got, decode_visible(lengths, 3, 9, True))


# ---------------------------------------------------------------- generic paths

@pytest.mark.parametrize("impl", ["naive", "xla", None])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("causal", [True, False])
def test_generic_paths_match_reference(impl, dtype, causal):
    q, k, v = random_qkv(3, 4, 24, 8, 2, 16, dtype, seed=5)
    lengths = jnp.array([24, 4, 13])
    out = attnlab.decode_attention(q, k, v, lengths, causal=causal, implementation=impl)
    assert_close(out, q, k, v, lengths, causal=causal)


def test_generic_path_under_jit_with_traced_lengths():
    q, k, v = random_qkv(2, 3, 16, 4, 1, 8, "float32", seed=6)
    f = jax.jit(lambda q, k, v, n: attnlab.decode_attention(q, k, v, n, implementation="xla"))
    for lengths in ([16, 3], [5, 9]):
        assert_close(f(q, k, v, jnp.array(lengths)), q, k, v, lengths)


def test_backend_without_masks_refuses_with_its_reason():
    q, k, v = random_qkv(1, 2, 16, 2, 2, 16, "bfloat16", seed=1)
    with pytest.raises(UnsupportedError, match="pallas-triton: "):
        attnlab.decode_attention(q, k, v, jnp.array([16]), implementation="pallas-triton")


def test_decode_on_a_backend_in_hand_is_decode_attention_by_its_name():
    """``decode_on`` (a sweep cell's decode call, its backend looked up once): the same result, the same refusal and
    the same empty batch as ``decode_attention(implementation=name)``."""
    from attnlab.api.decode import decode_on

    q, k, v = random_qkv(2, 1, 16, 2, 2, 16, "float32", seed=1)
    kw = dict(causal=True, local_window_size=(4, 0))
    lens = jnp.array([16, 7])
    want = attnlab.decode_attention(q, k, v, lens, implementation="naive", **kw)
    np.testing.assert_array_equal(decode_on(backends.get("naive"), q, k, v, lens, **kw), want)
    with pytest.raises(UnsupportedError) as by_name:
        attnlab.decode_attention(q, k, v, lens, implementation="pallas-triton", **kw)
    with pytest.raises(UnsupportedError) as in_hand:
        decode_on(backends.get("pallas-triton"), q, k, v, lens, **kw)
    assert str(in_hand.value) == str(by_name.value)
    assert decode_on(backends.get("naive"), q[:0], k[:0], v[:0], lens[:0]).shape == (0, 1, 2, 16)


# ---------------------------------------------------------------- the kernel (interpret mode)

KERNEL_CASES = {  # name: (B, T, S, N, K, H, dtype, lengths, causal, config)
    "ragged-gqa4-causal": (3, 4, 80, 4, 1, 64, "bfloat16", [80, 4, 37], True, dict(block_k=16, num_splits=3)),
    "ragged-gqa4-causal-whole": (3, 4, 80, 4, 1, 64, "bfloat16", [80, 4, 37], True,
                                 dict(block_k=16, num_splits=3, whole_blocks=True)),
    "t1-gqa4-ragged": (3, 1, 96, 8, 2, 128, "float16", [96, 1, 50], True, dict(block_k=32, num_splits=2)),
    "t1-gqa4-ragged-whole": (3, 1, 96, 8, 2, 128, "float16", [96, 1, 50], True,
                             dict(block_k=32, num_splits=2, whole_blocks=True)),
    "len-equals-T": (2, 5, 16, 4, 2, 32, "float32", [5, 5], True, dict(block_k=16)),
    "h256": (2, 2, 32, 4, 2, 256, "bfloat16", [32, 17], True, dict(block_k=16, num_splits=2)),
    "row-tiles": (2, 8, 40, 8, 2, 32, "bfloat16", [40, 9], True, dict(block_k=16, block_r=16, num_splits=2)),
    "gqa8-noncausal": (2, 3, 48, 16, 2, 16, "float16", [48, 20], False, dict(block_k=16, num_splits=4)),
    "gqa8-noncausal-whole": (2, 3, 48, 16, 2, 16, "float16", [48, 20], False,
                             dict(block_k=16, num_splits=4, whole_blocks=True)),
    "mha-f32-defaults": (2, 2, 24, 2, 2, 64, "float32", [24, 2], True, {}),
}


@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_kernel_matches_float64(case):
    B, T, S, N, K, H, dtype, lengths, causal, cfg = KERNEL_CASES[case]
    q, k, v = random_qkv(B, T, S, N, K, H, dtype, seed=len(case))
    out = kernel(q, k, v, lengths, causal, **cfg)
    assert_close(out, q, k, v, lengths, causal=causal)


def test_kernel_through_decode_attention_with_scale_and_jit_traced_lengths():
    q, k, v = random_qkv(2, 4, 32, 4, 2, 16, "bfloat16", seed=11)
    f = jax.jit(functools.partial(attnlab.decode_attention, causal=True, scale=0.3, implementation=KERNEL))
    for lengths in ([32, 4], [7, 19]):
        out = f(q, k, v, jnp.array(lengths, jnp.int32))
        assert_close(out, q, k, v, lengths, causal=True, scale=0.3)


def test_kernel_never_reads_past_the_valid_lengths():
    """NaN in the cache past each length: any read of it would poison the output (0 * NaN = NaN)."""
    B, T, S = 2, 3, 64
    q, k, v = random_qkv(B, T, S, 4, 2, 16, "float32", seed=12)
    lengths = [37, 3]
    past = (jnp.arange(S)[None, :] >= jnp.array(lengths)[:, None])[:, :, None, None]
    kp, vp = jnp.where(past, jnp.nan, k), jnp.where(past, jnp.nan, v)
    out = kernel(q, kp, vp, lengths, True, block_k=16, num_splits=2)
    assert np.all(np.isfinite(np.asarray(out)))
    assert_close(out, q, k, v, lengths)


def test_kernel_through_attention_key_value_seq_lengths():
    q, k, v = random_qkv(2, 2, 32, 4, 1, 32, "bfloat16", seed=13)
    lengths = jnp.array([32, 10])
    out = attnlab.attention(q, k, v, key_value_seq_lengths=lengths, implementation=KERNEL)
    assert attnlab.check_close(out, q, k, v, key_value_seq_lengths=lengths).ok
    out = attnlab.attention(q, k, v, implementation=KERNEL)     # no lengths: every key
    assert attnlab.check_close(out, q, k, v).ok


@st.composite
def decode_problems(draw):
    B = draw(st.integers(1, 2))
    T = draw(st.integers(1, 6))
    S = draw(st.integers(max(T, 16), 48))
    K = draw(st.sampled_from([1, 2]))
    G = draw(st.sampled_from([1, 2, 4]))
    H = draw(st.sampled_from([16, 32]))
    lengths = draw(st.lists(st.integers(T, S), min_size=B, max_size=B))
    causal = draw(st.booleans())
    splits = draw(st.integers(1, 3))
    return B, T, S, K * G, K, H, lengths, causal, splits


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(decode_problems())
def test_kernel_equals_naive_on_random_shapes(problem):
    B, T, S, N, K, H, lengths, causal, splits = problem
    q, k, v = random_qkv(B, T, S, N, K, H, "float32", seed=B * 7 + T * 13 + S)
    out = kernel(q, k, v, lengths, causal, block_k=16, num_splits=splits)
    want = attnlab.decode_attention(q, k, v, jnp.array(lengths), causal=causal, implementation="naive")
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=2e-5, atol=2e-5)


def test_kernel_lowers_to_triton_for_cuda_without_a_gpu():
    """Pallas -> Triton IR lowering (not Triton's own compile) for the H200 goal shape, on the CPU."""
    s = jax.ShapeDtypeStruct
    B, T, S, N, K, H = 8, 16, 32768, 32, 8, 128
    plan = kd.make_plan(B, T, S, N, K, H, "bfloat16", sms=132, compute_capability=(9, 0))
    f = jax.jit(functools.partial(kd.decode_attention_pallas, causal=True, interpret=False, plan=plan))
    args = (s((B, T, N, H), jnp.bfloat16), s((B, S, K, H), jnp.bfloat16), s((B, S, K, H), jnp.bfloat16),
            s((B,), jnp.int32))
    try:
        lowered = f.trace(*args).lower(lowering_platforms=("cuda",))
    except RuntimeError:   # JAX >= 0.11 needs a GPU, or an abstract one, to lower Triton
        with kd.cuda_lowering_context():
            lowered = f.trace(*args).lower(lowering_platforms=("cuda",))
    assert "__gpu$xla.gpu.triton" in lowered.as_text() or "triton_kernel_call" in lowered.as_text()


# ---------------------------------------------------------------- grid model, splits, SM count

def test_split_ranges_cover_exactly_the_valid_blocks():
    for length in (1, 15, 16, 17, 100, 1000):
        for splits in (1, 2, 3, 7, 16):
            ranges = [kd.split_range(length, j, num_splits=splits, block_k=16) for j in range(splits)]
            blocks = [b for first, n in ranges for b in range(first, first + n)]
            assert blocks == list(range(kd.cdiv(length, 16))), (length, splits)


def test_a_ragged_batch_reads_less():
    S, bk, splits = 32768, 64, 8
    uniform = kd.blocks_visited([S] * 8, num_splits=splits, block_k=bk)
    ragged = kd.blocks_visited([S, 1024, 4096, 64, 20000, 128, 512, 9000], num_splits=splits, block_k=bk)
    total = lambda v: sum(map(sum, v))  # noqa: E731
    assert total(uniform) == 8 * S // bk
    assert total(ragged) == sum(kd.cdiv(n, bk) for n in [S, 1024, 4096, 64, 20000, 128, 512, 9000])
    assert total(ragged) < 0.3 * total(uniform)
    assert ragged[3] == [1] + [0] * (splits - 1)     # a 64-key sequence: one program loads one block


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 1 << 18), st.integers(1, 2048), st.sampled_from([16, 32, 64, 128]),
       st.sampled_from([1, 4, 8, 16, 32, 64, 128, 256, 512]), st.sampled_from([64, 128, 256]),
       st.sampled_from([8, 108, 132]), st.integers(1, 4))
def test_split_count_properties(S, BK, bk, rows, H, sms, occ):
    kw = dict(rows=rows, block_k=bk, head_dim=H, sm_count=sms, occupancy=occ)
    s = kd.choose_num_splits(S, BK, **kw)
    n_blocks = kd.cdiv(S, bk)
    assert 1 <= s <= min(n_blocks, 128)
    per = kd.cdiv(n_blocks, s)
    assert (s - 1) * per < n_blocks                              # no split is empty at full length
    assert s == 1 or n_blocks // s >= 3                          # splits keep several blocks (4 before rounding)
    assert s == 1 or s * 2 * rows * (H + 2) * 4 <= 0.25 * 2 * S * H * 2   # partials <= 25% of the KV bytes
    if BK % (sms * occ) == 0:                                    # whole waves without splitting: no split
        assert s == 1


def test_split_count_for_the_goal_shapes():
    def filled(p, B, K, H=128):
        slots = 132 * kd.programs_per_sm(p.block_r, p.block_k, H, p.num_warps, p.num_stages)
        programs = B * K * p.row_tiles * p.num_splits
        return programs / (kd.cdiv(programs, slots) * slots)   # share of the program slots used over the waves

    p = kd.make_plan(8, 4, 32768, 32, 8, 128, "bfloat16", sms=132, compute_capability=(9, 0))
    assert p.rows == 16 and p.block_r == 16 and p.row_tiles == 1 and filled(p, 8, 8) >= 0.9
    p1 = kd.make_plan(1, 1, 131072, 32, 8, 128, "bfloat16", sms=132)
    assert p1.num_splits >= 32 and filled(p1, 1, 8) >= 0.9      # B*K = 8: the sequence must be split
    p64 = kd.make_plan(8, 64, 32768, 32, 8, 128, "bfloat16", sms=132)
    assert p64.rows == 256 and p64.block_r == 128 and p64.row_tiles == 2 and p64.num_warps == 8
    mqa = kd.make_plan(8, 64, 32768, 8, 1, 128, "bfloat16", sms=132)
    assert mqa.num_splits >= 4 and filled(mqa, 8, 1) >= 0.9      # compute-bound: splits despite the partials
    assert kd.programs_per_sm(16, 64, 128, 4, 3) == 3 and kd.programs_per_sm(128, 64, 128, 8, 3) == 1


def test_sm_count_from_core_count_table_or_cpu():
    assert kd.sm_count() == kd.CPU_SM_COUNT if jax.default_backend() == "cpu" else kd.sm_count() > 0
    dev = lambda kind, core=None: types.SimpleNamespace(platform="gpu", device_kind=kind, core_count=core)  # noqa: E731
    assert kd.sm_count(dev("NVIDIA H200")) == 132
    assert kd.sm_count(dev("NVIDIA H100 80GB HBM3")) == 132
    assert kd.sm_count(dev("NVIDIA H100 PCIe")) == 114
    assert kd.sm_count(dev("NVIDIA A100-SXM4-80GB")) == 108
    assert kd.sm_count(dev("NVIDIA H200", 130)) == 130
    assert kd.sm_count(dev("Some future GPU")) == kd.DEFAULT_SM_COUNT


def test_plan_rejects_bad_tuning_parameters():
    with pytest.raises(ValueError, match="block_r"):
        kd.make_plan(1, 1, 64, 4, 1, 64, config=kd.DecodeConfig(block_r=24), sms=8)
    with pytest.raises(ValueError, match="block_k"):
        kd.make_plan(1, 1, 64, 4, 1, 64, config=kd.DecodeConfig(block_k=48), sms=8)
    with pytest.raises(ValueError, match="num_splits"):
        kd.make_plan(1, 1, 64, 4, 1, 64, config=kd.DecodeConfig(num_splits=0), sms=8)


# ---------------------------------------------------------------- validation

def _inputs(B=2, T=4, S=16, N=4, K=2, H=8, dtype="float32"):
    return random_qkv(B, T, S, N, K, H, dtype)


@pytest.mark.parametrize("make, exc, match", [
    (lambda q, k, v: (q, k, v, np.array([3, 16])), ValueError, r"kv_lengths\[0\]=3 < T=4: the T new tokens must be in the cache"),
    (lambda q, k, v: (q, k, v, np.array([16, 17])), ValueError, r"kv_lengths\[1\]=17 > S_max=16"),
    (lambda q, k, v: (q, k, v, np.array([16])), ValueError, r"kv_lengths must have shape \(B,\)=\(2,\)"),
    (lambda q, k, v: (q, k, v, np.array([16.0, 16.0])), TypeError, "kv_lengths must be an integer array"),
    (lambda q, k, v: (q[0], k, v, np.array([16, 16])), ValueError, r"q must have rank 4 \(B, T, N, H\)"),
    (lambda q, k, v: (q, k[..., None], v[..., None], np.array([16, 16])), ValueError, r"k_cache must have rank 4 \(B, S_max"),
    (lambda q, k, v: (q, k[:, :, 0], v[:, :, 0], np.array([16, 16])), ValueError, r"k_cache must have rank 4 \(B, S_max"),
    (lambda q, k, v: (q, k, v[:, :8], np.array([8, 8])), ValueError, "v_cache shape"),
    (lambda q, k, v: (q, k[:, :3], v[:, :3], np.array([3, 3])), ValueError, "S_max=3 must be >= T=4"),
    (lambda q, k, v: (q[:, :, :3], k, v, np.array([16, 16])), ValueError, "N=3 must be a multiple of k_cache heads K=2"),
    (lambda q, k, v: (q[..., :4], k, v, np.array([16, 16])), ValueError, "head dim 8 must equal q's head dim H=4"),
    (lambda q, k, v: (q.astype(jnp.bfloat16), k, v, np.array([16, 16])), TypeError, "share one dtype"),
    (lambda q, k, v: (q[:1], k, v, np.array([16])), ValueError, "batch size 2 must equal q's batch size B=1"),
    (lambda q, k, v: (q.astype(jnp.int32), k.astype(jnp.int32), v.astype(jnp.int32), np.array([16, 16])), TypeError, "floating dtype"),
])
def test_validation_errors_name_the_argument_and_rule(make, exc, match):
    with pytest.raises(exc, match=match):
        attnlab.decode_attention(*make(*_inputs()))


def test_validation_of_causal_scale_and_implementation():
    q, k, v = _inputs()
    lengths = np.array([16, 4])
    with pytest.raises(TypeError, match="causal must be a bool"):
        attnlab.decode_attention(q, k, v, lengths, causal=1.0)
    with pytest.raises(ValueError, match="scale must be finite, got nan"):
        attnlab.decode_attention(q, k, v, lengths, scale=float("nan"))
    with pytest.raises(ValueError, match="implementation must be None, 'auto' or one of"):
        attnlab.decode_attention(q, k, v, lengths, implementation="nope")
    # lists are accepted for kv_lengths
    assert attnlab.decode_attention(q, k, v, [16, 4]).shape == q.shape


def test_value_checks_skipped_for_traced_lengths():
    q, k, v = _inputs()
    seen = []
    jax.jit(lambda n: seen.append(prepare_decode(q, k, v, n).spec) or n)(jnp.array([1, 99], jnp.int32))
    assert seen[0].q_len == 4 and seen[0].max_len == 16


# ---------------------------------------------------------------- backends: reasons, auto hook

def _spec(B=1, T=1, S=64, N=4, K=1, H=64, dtype="bfloat16", **kw):
    s = jax.ShapeDtypeStruct
    return attnlab.core.prepare.prepare(s((B, T, N, H), dtype), s((B, S, K, H), dtype), s((B, S, K, H), dtype), **kw).spec


def test_kernel_backend_reasons():
    b = backends.get(KERNEL)
    assert b.forward_only and b.mode_reason(_spec(), "fwd+bwd") == "forward only, no backward pass"
    assert b.supports(_spec(key_value_seq_lengths=jnp.ones(1, jnp.int32))) is None
    with jax.enable_x64(True):    # without x64 a float64 input is float32 to JAX (and to the spec)
        assert "float64" in b.supports(_spec(dtype="float64"))
    assert "head dim 96" in b.supports(_spec(H=96))
    assert "> 512" in b.supports(_spec(T=128, S=256, N=8, K=1))
    assert "top-left" in b.supports(_spec(T=2, is_causal=True))
    assert "takes no mask" in b.supports(_spec(mask=jnp.ones((1, 1, 1, 64), bool)))
    assert "query_seq_lengths" in b.supports(_spec(query_seq_lengths=jnp.ones(1, jnp.int32)))
    assert "local_window_size" in b.supports(_spec(local_window_size=(4, 0)))


def test_kernel_backend_refuses_traced_scale_and_auto_skips_interpret_mode():
    q, k, v = random_qkv(1, 2, 16, 2, 1, 16, "float32")
    with pytest.raises(UnsupportedError, match="scale is traced"):
        jax.jit(lambda s: attnlab.decode_attention(q, k, v, jnp.array([16]), scale=s, implementation=KERNEL))(0.5)
    e = attnlab.explain_decode(q, k, v, [16])
    if jax.default_backend() == "cpu":
        assert e.chosen != KERNEL and e.reasons[KERNEL] is None
        assert "interpret mode" in backends.get(KERNEL).auto_reason(e.spec)


def test_auto_off_switch(monkeypatch):
    monkeypatch.setattr(attnlab_decode, "AUTO_ENABLED", False)
    b = backends.get(KERNEL)
    monkeypatch.setattr(type(b), "interpret", property(lambda self: False))
    q, k, v = random_qkv(1, 2, 16, 2, 1, 16, "float32")
    assert "auto off" in b.auto_reason(attnlab.explain_decode(q, k, v, [16]).spec)
    assert "auto off" in b.auto_claim(_spec(T=4, S=4096))


def test_attention_auto_claims_decode_shapes_on_a_gpu(monkeypatch):
    """Switched on, attention() with small T against a long cache runs the kernel under auto (on a
    GPU); not T=1, not short caches, not causal (jax.nn's top-left rule). Off by default."""
    b = backends.get(KERNEL)
    monkeypatch.setattr(type(b), "interpret", property(lambda self: False))
    assert "forward only" in b.auto_claim(_spec(T=4, S=4096))
    monkeypatch.setattr(attnlab_decode, "AUTO_CLAIMS_ATTENTION", True)
    assert b.auto_claim(_spec(T=4, S=4096, key_value_seq_lengths=jnp.full((1,), 3000, jnp.int32))) is None
    assert "T=1" in b.auto_claim(_spec(T=1, S=4096))
    assert "S=64" in b.auto_claim(_spec(T=4, S=64))
    assert "T=128" in b.auto_claim(_spec(T=128, S=4096))
    assert "top-left" in b.auto_claim(_spec(T=4, S=4096, is_causal=True))
    q, k, v = random_qkv(1, 4, 2048, 4, 2, 16, "float32")
    assert attnlab.explain(q, k, v).chosen == KERNEL
    monkeypatch.undo()
    if jax.default_backend() == "cpu":
        assert attnlab.explain(q, k, v).chosen != KERNEL


def test_auto_hook_picks_the_kernel_when_enabled(monkeypatch):
    monkeypatch.setattr(attnlab_decode, "AUTO_ENABLED", True)
    b = backends.get(KERNEL)
    monkeypatch.setattr(type(b), "interpret", property(lambda self: False))
    q, k, v = random_qkv(1, 2, 16, 2, 1, 16, "float32")
    assert attnlab.explain_decode(q, k, v, [16]).chosen == KERNEL
    assert "T=1 < 2" in b.auto_reason(attnlab.explain_decode(q[:, :1], k, v, [16]).spec)


def test_pallas_paged_reasons():
    b = backends.get("pallas-paged")
    if jax.default_backend() != "gpu":
        assert "GPU" in b.available()
    assert b.supports(_spec(key_value_seq_lengths=jnp.ones(1, jnp.int32))) is None
    assert "T = 1" in b.supports(_spec(T=2))
    assert "multiple of the page size" in b.supports(_spec(S=40))
    assert "float32 not supported" in b.supports(_spec(dtype="float32"))
    assert "no mask" in b.supports(_spec(mask=jnp.ones((1, 1, 1, 64), bool)))
    from attnlab.backends.pallas_paged import launch_params

    assert launch_params(32768) == (16, 8) and launch_params(48) == (1, 1) and launch_params(64) == (4, 1)


def test_roofline_and_bytes():
    assert attnlab_decode.kv_bytes([32768] * 8, 8, 128, 2) == 1_073_741_824
    # by hand, H200 defaults (4.8 TB/s, 989 TFLOP/s): T = 1 reads 1 GiB of K and V: 0.22370 ms (its
    # 4.3 GFLOP would take 0.0043 ms); T = 64 computes 8 x (64 x 32704 + 64 x 65 / 2) causal pairs per head,
    # 4 x 32 x 128 x 16761088 = 274.6 GFLOP: 0.27767 ms > 0.22370
    assert attnlab_decode.roofline_ms([32768] * 8, 1, 32, 8, 128, 2) == pytest.approx(0.223696, rel=1e-5)
    assert attnlab_decode.roofline_ms([32768] * 8, 64, 32, 8, 128, 2) == pytest.approx(0.277668, rel=1e-5)
    # a window of 128 at T = 64: each query sees 129 keys (64 x 129 pairs), 192 keys read: bytes-bound
    # 2 x 192 x 8 x 128 x 2 B / 4.8 TB/s = 0.16384 us (every key read 64 times would say 0.2036 us, FLOP-bound)
    assert attnlab_decode.roofline_ms([32768], 64, 32, 8, 128, 2, window=(128, 0)) == pytest.approx(1.6384e-4)


# ---------------------------------------------------------------- the GPU tuning script's pure parts

def test_tune_grid_and_goal_lines():
    from attnlab.sweep import decode_tune as dt
    for sh in dt.shapes():
        base = kd.make_plan(*dt.sizes(sh), sh.dtype, sms=132, compute_capability=(9, 0))
        grid = dt.tune_grid(sh, base)
        assert 6 <= len(grid) <= 12 and {} not in grid
        for cfg in grid:
            p = kd.make_plan(*dt.sizes(sh), sh.dtype, kd.DecodeConfig(**cfg), sms=132)
            assert kd.smem_bytes(p.block_r, p.block_k, sh.head_dim, p.num_stages) <= dt.SMEM_LIMIT
    assert sum(len(dt.tune_grid(s, kd.make_plan(*dt.sizes(s), sms=132))) + 1 for s in dt.shapes()) <= 170
    goal = lambda t: dt.label(dt.shape(8, 32768, 32, 8, 128, t))  # noqa: E731
    best = lambda ms, gbps, roof: {"ms": ms, "gbps": gbps, "pct_hbm": gbps / 48, "pct_roofline": roof}  # noqa: E731
    report = {"shapes": [{"label": goal(1), "best": best(0.25, 4300, 90), "cudnn_kvlen_ms": 0.244},
                         {"label": goal(4), "best": best(0.27, 3900, 85), "cudnn_kvlen_ms": 0.75},
                         {"label": goal(64), "best": best(0.40, 2700, 72)}]}
    lines = dt.goal_lines(report)
    assert lines[0].startswith("T=1: 0.2500 ms vs cuDNN 0.2440 ms") and "met" in lines[0]
    assert "missed by 0.10 TB/s" in lines[2] and "2.78x cuDNN" in lines[2]
    assert "T=64: 72% of the roofline bound -> met" in lines[6] and lines[1] == "T=2: no result"


def test_plans_fit_shared_memory():
    """A tuning variant that asked for more pipeline stages than shared memory holds failed on the H200
    (RESOURCE_EXHAUSTED: 278528 B > 232448 B); the planner clamps the stages to what fits."""
    from attnlab.kernels import decode as kd

    plan = kd.make_plan(4, 16, 4096, 32, 8, 128, "bfloat16", kd.DecodeConfig(block_k=128, num_stages=4), sms=132)
    assert plan.num_stages < 4
    # the estimate with the measured under-count (278528 / 245760) still fits
    assert kd.smem_bytes(plan.block_r, plan.block_k, 128, plan.num_stages) * 278528 / 245760 <= 232448
    assert kd.smem_bytes(64, 128, 128, 4) * kd.SMEM_SLACK > kd.smem_limit((9, 0))   # the failing variant
    for H in kd.HEAD_DIMS:
        for T in (1, 4, 16, 64):
            p = kd.make_plan(8, T, 32768, 32, 8, H, "bfloat16", sms=132)
            assert kd.smem_bytes(p.block_r, p.block_k, H, p.num_stages) * kd.SMEM_SLACK <= kd.smem_limit()
    with pytest.raises(ValueError, match="shared memory"):
        kd.make_plan(1, 64, 4096, 64, 1, 256, "float32", kd.DecodeConfig(block_k=512, block_r=128), sms=132)


def test_torch_peers_decode_rules():
    """PyTorch's flash kernel takes no mask: full caches only (causal lower-right); cuDNN and
    memory-efficient take a boolean mask, so ragged lengths too."""
    flash, cudnn = backends.get("torch-flash"), backends.get("torch-cudnn")
    assert flash.decode and cudnn.decode
    assert "ragged" in flash.decode_reason((10, 20), 4, 20)
    assert flash.decode_reason((20, 20), 4, 20) is None
    assert cudnn.decode_reason((10, 20), 4, 20) is None


def _canned_decode_records():
    recs = []
    for T, ms in ((1, 0.25), (4, 0.26), (16, 0.27)):
        for b, f in (("attnlab-decode", 1.0), ("cudnn", 1.0 if T == 1 else 3.0)):
            recs.append(dict(backend=b, q_len=T, kv_len=32768, lengths="full", status="ok", timer="cupti",
                             kernel_ms=ms * f, gbps=1.07e9 * 2 / (ms * f * 1e-3) / 1e9, pct_roofline=90 / f,
                             roofline_ms=0.224))
    recs.append(dict(backend="torch-flash", q_len=4, kv_len=32768, lengths="full", status="unsupported",
                     reason="the flash kernel takes no mask"))
    return recs


def test_decode_section_renders_from_canned_records(tmp_path):
    """The lab's decode section is a pure function of records: table, roofline line, why peers fall off."""
    from attnlab.lab.step_types import LabConfig
    from attnlab.lab.steps.decode import render_decode

    s = render_decode(_canned_decode_records(), LabConfig(gpu=True), str(tmp_path))
    assert s.status == "ok" and s.facts["fastest_by_T"] == {"1": "attnlab-decode", "4": "attnlab-decode", "16": "attnlab-decode"}
    t = s.tables[0]
    assert t.columns == ["T", "attnlab-decode", "cudnn", "torch-flash", "roofline bound"]
    assert "90% roof" in t.rows[0][1] and "unsupported" in t.rows[1][3] and t.rows[0][-1] == "0.224 ms"
    assert any("fall off at T > 1" in p and "cudnn 3.24×" in p for p in s.paragraphs)
    assert os.path.exists(s.plots[0])


def test_decode_step_runs_on_cpu(tmp_path):
    from attnlab.lab import STEPS, run_lab

    assert "decode" in STEPS
    (sec,) = run_lab(str(tmp_path), quick=True, sections=["decode"])
    assert sec.status == "ok", sec.reason
    assert sec.facts["ok"] == sec.facts["cells"] == 5          # the CPU quick plan: attnlab-decode and xla at T = 4,
    assert any(t.title.startswith("attnlab-decode by group size") for t in sec.tables)   # a paged16 cell, 2 serving
    assert any("interpret mode" in p for p in sec.paragraphs)


def test_the_decode_verdict_judges_the_worst_row_too():
    """One query that misses its own key (a length bound off by one, in one sequence of a bf16 batch) is 6x the
    correct rows' error but under the whole output's limit: the worst-row criterion fails it, as check_close's does."""
    import ml_dtypes

    ref64 = reference_decode_attention
    bf, rng = ml_dtypes.bfloat16, np.random.default_rng(1)
    B, T, N, K, H, S = 2, 8, 8, 2, 64, 4096
    q = rng.standard_normal((B, T, N, H)).astype(bf)
    k, v = (rng.standard_normal((B, S, K, H)).astype(bf) for _ in range(2))
    lens = np.array([S, S])
    good = ref64(q, k, v, lens, emulate=bf).astype(bf)
    bad = good.copy()
    bad[1, T - 1] = ref64(q[1:, T - 1:], k[1:], v[1:], np.array([S - 1]), emulate=bf)[0, 0].astype(bf)
    ok, wrong = check_decode_close(good, q, k, v, lens), check_decode_close(bad, q, k, v, lens)
    assert ok.ok and wrong.rel_err <= wrong.limit and wrong.row_err > 3 * ok.row_err and not wrong.ok


def test_attnlab_decode_refuses_x64_and_a_traced_scale_where_explain_looks():
    """Under x64 its Pallas index arithmetic mixed int32 and int64 (a TypeError inside JAX); a traced scale was
    refused by the call after explain said it runs."""
    q, k = jnp.ones((1, 4, 4, 32), jnp.float32), jnp.ones((1, 16, 2, 32), jnp.float32)
    with jax.enable_x64(True):
        assert "x64 mode" in attnlab.explain(q, k, k).reasons["attnlab-decode"]
        with pytest.raises(UnsupportedError, match="attnlab-decode: JAX's x64 mode is on"):
            attnlab.attention(q, k, k, implementation="attnlab-decode")
        with pytest.raises(UnsupportedError, match="x64 mode"):
            attnlab.decode_attention(q, k, k, jnp.array([16]), implementation="attnlab-decode")

    @jax.jit
    def f(q, s):
        assert "scale is traced" in attnlab.explain(q, k, k, scale=s).reasons["attnlab-decode"]
        return attnlab.attention(q, k, k, scale=s)        # auto passes it by
    assert f(q, 0.5).shape == q.shape
