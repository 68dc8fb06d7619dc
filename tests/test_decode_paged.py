"""Paged KV caches (vLLM layout) for decode (issue 25, item 3): pages, the kernel reading through the
table (interpret mode), decode_attention(page_table=...), cuDNN's paged path's rules, sweep cells."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab import backends
from attnlab.core.problem import Problem
from attnlab.reference.inputs import random_qkv
from attnlab.kernels import decode as kd
from attnlab.kernels import pages as kp
from attnlab.reference.decode64 import check_decode_close


def paged_inputs(B, T, S, N, K, H, dtype, page_size, lengths, seed=0):
    q, k, v = random_qkv(B, T, S, N, K, H, dtype, seed=seed)
    k_pages, v_pages, table = kp.to_pages(k, v, page_size, seed=seed)
    return q, k, v, k_pages, v_pages, table


def test_pages_gather_back_to_the_contiguous_cache():
    q, k, v, kpg, vpg, table = paged_inputs(3, 1, 64, 2, 2, 8, "float32", 16, None, seed=4)
    assert kpg.shape == (12, 16, 2, 8) and table.shape == (3, 4) and table.dtype == np.int32
    assert sorted(table.ravel().tolist()) == list(range(12)) and table.ravel().tolist() != list(range(12))
    np.testing.assert_array_equal(np.asarray(kp.gather_pages(kpg, table)), np.asarray(k))
    np.testing.assert_array_equal(kp.gather_pages(np.asarray(vpg), table), np.asarray(v))
    padded = table.copy()
    padded[1, 2:] = -1                               # slots past length 20 (2 pages) unused
    got = np.asarray(kp.gather_pages(kpg, padded, [64, 20, 64]))
    np.testing.assert_array_equal(got[1, :20], np.asarray(k)[1, :20])
    with pytest.raises(ValueError, match="page_size must divide S=64"):
        kp.to_pages(k, v, 24)


# (B, T, S, N, K, H, dtype, page_size, block_k, lengths): block_k below, equal to and above the page size
PAGED_CASES = {
    "ps16-bk16": (2, 3, 64, 8, 2, 64, "bfloat16", 16, 16, [64, 19]),
    "ps8-bk32-gather": (2, 2, 64, 7, 1, 128, "bfloat16", 8, 32, [64, 33]),
    "ps32-bk16": (3, 1, 128, 4, 2, 64, "float16", 32, 16, [128, 1, 70]),
    "ps64-bk32-h256": (2, 4, 128, 6, 2, 256, "bfloat16", 64, 32, [100, 4]),
    "ps128-bk64": (2, 5, 256, 10, 2, 64, "bfloat16", 128, 64, [256, 130]),
    "ps16-bk64-f32": (2, 2, 64, 4, 4, 32, "float32", 16, 64, [64, 17]),
}


@pytest.mark.parametrize("case", list(PAGED_CASES))
def test_paged_kernel_matches_its_contiguous_twin(case):
    B, T, S, N, K, H, dtype, ps, bk, lengths = PAGED_CASES[case]
    q, k, v, kpg, vpg, table = paged_inputs(B, T, S, N, K, H, dtype, ps, lengths, seed=len(case))
    out = kd.decode_attention_pallas(q, kpg, vpg, jnp.asarray(lengths), causal=True, interpret=True,
                                     config=kd.DecodeConfig(block_k=bk, num_splits=2, whole_blocks="bk32" in case),
                                     page_table=table)
    verdict = check_decode_close(out, q, k, v, lengths, causal=True)
    assert verdict.ok, verdict


@pytest.mark.parametrize("page_size, block_k, whole", [(16, 16, False), (8, 32, True), (32, 16, True)])
def test_paged_kernel_never_reads_unused_slots_or_page_tails(page_size, block_k, whole):
    """NaN in every page position past a length and -1 in every unused table slot: a read of either
    would poison the output (0 * NaN) or address outside the pages (``whole``: the whole blocks unmasked)."""
    B, T, S = 2, 3, 64
    lengths = [37, 3]
    q, k, v, kpg, vpg, table = paged_inputs(B, T, S, 4, 2, 32, "float32", page_size, lengths, seed=9)
    past = np.arange(S)[None, :] >= np.array(lengths)[:, None]            # (B, S) logical positions
    kn, vn = np.asarray(k).copy(), np.asarray(v).copy()
    kn[past], vn[past] = np.nan, np.nan
    kpg, vpg, _ = kp.to_pages(jnp.asarray(kn), jnp.asarray(vn), page_size, seed=9)
    table = table.copy()
    for b, n in enumerate(kp.pages_in_use(lengths, page_size)):
        table[b, n:] = -1
    out = kd.decode_attention_pallas(q, kpg, vpg, jnp.asarray(lengths), causal=True, interpret=True,
                                     config=kd.DecodeConfig(block_k=block_k, num_splits=2, whole_blocks=whole),
                                     page_table=table)
    assert np.all(np.isfinite(np.asarray(out)))
    assert check_decode_close(out, q, k, v, lengths).ok


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "pages-of-8"])
def test_nan_in_the_cache_past_each_length_changes_no_path_and_no_verdict(paged):
    """The cache's padding (positions >= kv_lengths[b]: a recycled page's stale rows, a failed request's NaN) is
    never attended: every decode and serving path, the float64 references and the verdict see only valid keys."""
    lengths = [13, 4]
    q, k, v = random_qkv(2, 2, 16, 4, 2, 16, "float32", seed=3)
    past = np.arange(16)[None, :] >= np.array(lengths)[:, None]
    kn, vn = np.asarray(k).copy(), np.asarray(v).copy()
    kn[past], vn[past] = np.nan, np.nan
    want = attnlab.reference_decode_attention(q, k, v, lengths)
    np.testing.assert_allclose(attnlab.reference_decode_attention(q, kn, vn, lengths), want)
    args = dict(zip(("k_cache", "v_cache", "page_table"), kp.to_pages(jnp.asarray(kn), jnp.asarray(vn), 8, seed=3)
                    if paged else (kn, vn, None)))
    for impl in ("xla", "naive", "attnlab-decode"):
        out = attnlab.decode_attention(q, **args, kv_lengths=lengths, implementation=impl)
        assert check_decode_close(out, q, kn, vn, lengths).ok, impl
    q1, starts = np.asarray(q)[:, -1], np.arange(3, dtype=np.int32)      # the last token of each: a serving step
    for impl in ("xla", "attnlab-decode"):
        out = attnlab.serving_attention(q1, q_starts=starts, kv_lengths=np.array(lengths), implementation=impl, **args)
        np.testing.assert_allclose(np.asarray(out), want[:, -1], rtol=2e-5, atol=2e-5, err_msg=impl)


@pytest.mark.parametrize("impl", ["attnlab-decode", "xla", "naive", None])
def test_decode_attention_with_a_page_table_equals_the_contiguous_call(impl):
    lengths = [64, 20]
    q, k, v, kpg, vpg, table = paged_inputs(2, 3, 64, 8, 2, 32, "float32", 16, lengths, seed=2)
    out = attnlab.decode_attention(q, kpg, vpg, lengths, page_table=table, implementation=impl)
    assert check_decode_close(out, q, k, v, lengths).ok
    want = attnlab.decode_attention(q, k, v, lengths, implementation="naive")
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=2e-5, atol=2e-5)


def test_paged_kernel_under_jit_with_traced_table_and_lengths():
    q, k, v, kpg, vpg, table = paged_inputs(2, 2, 64, 4, 2, 16, "bfloat16", 16, None, seed=3)
    f = jax.jit(functools.partial(attnlab.decode_attention, implementation="attnlab-decode"))
    for lengths in ([64, 2], [17, 40]):
        out = f(q, kpg, vpg, jnp.array(lengths, jnp.int32), page_table=jnp.asarray(table))
        assert check_decode_close(out, q, k, v, lengths).ok


def _paged_args():
    q, k, v, kpg, vpg, table = paged_inputs(2, 2, 64, 4, 2, 16, "float32", 16, None)
    return q, kpg, vpg, table


@pytest.mark.parametrize("make, exc, match", [
    (lambda q, kp_, vp, t: (q, kp_[0], vp[0], t), ValueError, r"k_cache must have rank 4 \(P, page_size, K, H\)"),
    (lambda q, kp_, vp, t: (q, kp_, vp[:4], t), ValueError, "v_cache shape .* must equal k_cache shape"),
    (lambda q, kp_, vp, t: (q, kp_, vp, t[:1]), ValueError, r"page_table must have shape \(B, pages_per_seq\) = \(2,"),
    (lambda q, kp_, vp, t: (q, kp_, vp, t.astype(np.float32)), TypeError, "page_table must be an integer array"),
    (lambda q, kp_, vp, t: (q, kp_, vp, np.where(np.arange(4) == 1, 8, t)), ValueError,
     r"page_table\[0, 1\]=8 is not a page index in \[0, 8\)"),
    (lambda q, kp_, vp, t: (q, kp_, vp, np.where(np.arange(4) == 3, -1, t)), ValueError, r"page_table\[0, 3\]=-1"),
])
def test_paged_validation_names_the_argument_and_rule(make, exc, match):
    q, kpg, vpg, table = make(*_paged_args())
    with pytest.raises(exc, match=match):
        attnlab.decode_attention(q, kpg, vpg, [64, 30], page_table=table)


def test_unused_slots_may_hold_anything_and_lengths_are_checked_against_pages_per_seq():
    q, kpg, vpg, table = _paged_args()
    table = table.copy()
    table[1, 2:] = -1                                   # length 30 uses 2 slots of 16
    assert attnlab.decode_attention(q, kpg, vpg, [64, 30], page_table=table).shape == q.shape
    with pytest.raises(ValueError, match=r"kv_lengths\[1\]=65 > S_max=64"):
        attnlab.decode_attention(q, kpg, vpg, [64, 65], page_table=table)


def test_kernel_refuses_a_page_size_that_is_not_a_power_of_two():
    q, k, v = random_qkv(1, 1, 48, 2, 1, 16, "float32")
    kpg, vpg, table = kp.to_pages(k, v, 24)
    with pytest.raises(attnlab.UnsupportedError, match="page size 24 is not a power of two"):
        attnlab.decode_attention(q, kpg, vpg, [48], page_table=table, implementation="attnlab-decode")
    out = attnlab.decode_attention(q, kpg, vpg, [48], page_table=table, implementation="xla")   # gathered twin
    assert check_decode_close(out, q, k, v, [48]).ok


def test_cudnn_paged_rules_and_which_backends_have_a_paged_path():
    from attnlab.backends.cudnn_paged import paged_reason
    from attnlab.api.decode import DecodeSpec
    from attnlab.measure.inputs import paged_refusal

    spec = DecodeSpec(Problem(2, 1, 64, 4, 2, 64, "bfloat16", causal=True), scale=None, page_size=16)
    assert paged_reason(spec, 8, 4) is None
    assert "exactly B * pages_per_seq = 8 pages, got 9" in paged_reason(spec, 9, 4)
    f32 = dataclasses.replace(spec, problem=dataclasses.replace(spec.problem, dtype="float32"))
    assert "float32 not supported" in paged_reason(f32, 8, 4)
    assert paged_refusal(backends.get("attnlab-decode")) is None and paged_refusal(backends.get("cudnn")) is None
    assert "gather the pages" in paged_refusal(backends.get("xla"))


def test_paged_lowers_to_triton_for_cuda_without_a_gpu():
    s = jax.ShapeDtypeStruct
    B, T, S, N, K, H = 8, 4, 32768, 28, 4, 128
    plan = kd.make_plan(B, T, S, N, K, H, "bfloat16", sms=132, compute_capability=(9, 0))
    for ps in (16, 128):                 # block_k 64: a gather of 4 pages, and a part of one page
        P = B * S // ps
        f = jax.jit(functools.partial(kd.decode_attention_pallas, causal=True, interpret=False, plan=plan))
        args = (s((B, T, N, H), jnp.bfloat16), s((P, ps, K, H), jnp.bfloat16), s((P, ps, K, H), jnp.bfloat16),
                s((B,), jnp.int32))
        with kd.cuda_lowering_context():
            text = f.trace(*args, page_table=s((B, S // ps), jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
        assert "triton" in text


# ---------------------------------------------------------------- sweep cells

def test_paged_cells_and_sweep_values():
    from attnlab.measure.cell import IDENTITY_DEFAULTS, Cell, record_key
    from attnlab.sweep.spec import Sweep, SweepError

    c = Cell("attnlab-decode", 2, 4, 64, 8, 2, 32, "bfloat16", True, lengths="paged", page_size=16)
    assert c.kv_lengths() == (64, 64) and c.identity()["page_size"] == 16 and "decode-paged16" in c.config_label
    assert IDENTITY_DEFAULTS["page_size"] is None
    old = {k: v for k, v in Cell("x", 1, 1, 8, 1, 1, 8, "float32", False).identity().items() if k != "page_size"}
    assert record_key(old) == Cell("x", 1, 1, 8, 1, 1, 8, "float32", False).key()
    with pytest.raises(ValueError, match="page_size is given exactly for lengths 'paged'"):
        Cell("x", 2, 4, 64, 8, 2, 32, "bfloat16", True, lengths="full", page_size=16)
    with pytest.raises(ValueError, match="page_size must divide kv_len=64"):
        Cell("x", 2, 4, 64, 8, 2, 32, "bfloat16", True, lengths="paged", page_size=48)
    sw = Sweep(backends=["attnlab-decode"], batch=[2], q_len=[1], kv_len=[64], heads=[4], kv_heads=[2],
               head_dim=[32], lengths=["paged", "paged32", "full"])
    assert [(c.lengths, c.page_size) for c in sw.cells()] == [("paged", 16), ("paged", 32), ("full", None)]
    with pytest.raises(SweepError, match="pagedN"):
        Sweep(backends=["xla"], batch=[2], q_len=[1], kv_len=[64], heads=[4], lengths=["pagedx"])


def test_a_paged_cell_shares_its_contiguous_twins_reference():
    from attnlab.measure.cell import Cell
    from attnlab.measure.check import ref_key

    full = Cell("cudnn", 2, 4, 64, 8, 2, 32, "bfloat16", True, lengths="full")
    for ps in (16, 32):
        paged = Cell("attnlab-decode", 2, 4, 64, 8, 2, 32, "bfloat16", True, lengths="paged", page_size=ps)
        assert ref_key(paged, 0) == ref_key(full, 0)
    assert ref_key(Cell("cudnn", 2, 4, 64, 8, 2, 32, "bfloat16", True, lengths="ragged"), 0) != ref_key(full, 0)


def test_paged_cells_through_the_sweep_engine_on_the_cpu():
    """attnlab-decode on a paged cell is checked on the whole output (as its contiguous twin) and timed;
    a backend without a paged path of its own is refused with the reason, not timed on a gathered copy."""
    from attnlab.measure import Cell, Options, measure_cell

    opts = Options(repeats=1, warmup=0, pipelined_calls=1, min_time_s=0.0)
    cell = Cell("attnlab-decode", 2, 3, 64, 8, 2, 32, "bfloat16", True, lengths="paged", page_size=16)
    rec = measure_cell(cell, opts)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["checked_fraction"] == 1.0 and rec["page_size"] == 16 and rec["lengths"] == "paged"
    rec = measure_cell(Cell("xla", 2, 3, 64, 8, 2, 32, "bfloat16", True, lengths="paged", page_size=16), opts)
    assert rec["status"] == "unsupported" and "no paged KV cache path of its own" in rec["reason"]


def test_explain_decode_with_a_page_table():
    q, kpg, vpg, table = _paged_args()
    e = attnlab.explain_decode(q, kpg, vpg, [64, 30], page_table=table)
    assert e.spec.page_size == 16 and e.spec.max_len == 64 and e.reasons["attnlab-decode"] is None


@pytest.mark.parametrize("page_size", [16, 64])
def test_paged_kernel_keeps_the_contiguous_prefetch_distance(monkeypatch, page_size):
    """Issue 25: the paged K/V load depends on a page-table load (one indirection level), and Triton
    prefetches each load (num_stages - 1) // (levels + 1) iterations ahead; compiled with the contiguous
    plan's num_stages the paged kernel had half the pipeline (1.2-1.6x slower at T*G >= 28 on the H200)."""
    from jax.experimental.pallas import triton as plgpu

    seen = []
    real = plgpu.CompilerParams

    def record(**kw):
        seen.append(kw["num_stages"])
        return real(**kw)

    monkeypatch.setattr(plgpu, "CompilerParams", record)
    B, T, S, N, K, H = 1, 4, 64, 8, 1, 16
    q, k, v, kpg, vpg, table = paged_inputs(B, T, S, N, K, H, "bfloat16", page_size, None, seed=2)
    plan = kd.make_plan(B, T, S, N, K, H, "bfloat16", compute_capability=(9, 0))
    n = jnp.full((B,), S, jnp.int32)
    out_c = kd.decode_attention_pallas(q, k, v, n, causal=True, interpret=True, plan=plan)
    out_p = kd.decode_attention_pallas(q, kpg, vpg, n, causal=True, interpret=True, plan=plan, page_table=table)
    contiguous, paged = seen
    assert contiguous == plan.num_stages == 3
    assert (paged - 1) // 2 == (contiguous - 1) // 1 == 2        # K/V latency in Triton's AssignLatencies
    np.testing.assert_allclose(np.asarray(out_p, np.float32), np.asarray(out_c, np.float32), rtol=0, atol=0)
