"""Sliding windows (``local_window_size``) in decode_attention and serving_attention: the float64 references,
the checks, the masked paths, attnlab's kernels (Pallas interpret mode) and the cost of the window.

Every kernel case runs on a cache poisoned with NaN before the window (every key before it; pages of >=
block_k keys: every block before its block); any load of them would make the output NaN
(0 * NaN = NaN in P.V), so it checks both the values and that those keys are never read. Shapes stay tiny: interpret mode runs the grid program by program."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab import backends
from attnlab.backends import attnlab_decode
from attnlab.core import serving_cost
from attnlab.core.errors import UnsupportedError
from attnlab.kernels import decode as kd
from attnlab.kernels import serving_plan as sp
from attnlab.kernels.pages import to_pages
from attnlab.kernels.serving import serving_attention_pallas
from attnlab.reference.decode64 import check_decode_close, reference_decode_attention
from attnlab.reference.float64 import reference_attention
from attnlab.reference.inputs import random_qkv
from attnlab.reference.serving64 import reference_serving_attention
from attnlab.reference.tolerance import rel_l2, tolerance


def poisoned(x, firsts):
    """``x`` (B, S, K, H) with NaN at the positions before each sequence's ``firsts[b]``."""
    before = (jnp.arange(x.shape[1])[None, :] < jnp.asarray(firsts)[:, None])[:, :, None, None]
    return jnp.where(before, jnp.nan, x)


# ---------------------------------------------------------------- the references and the masked paths

def test_reference_equals_attention_reference_at_absolute_positions():
    """decode64's window is jax.nn's window around each query's absolute position (float64.py's own mask)."""
    q, k, v = random_qkv(2, 3, 20, 4, 2, 8, "float32", seed=1)
    lengths = np.array([20, 9])
    pos = lengths[:, None] - 3 + np.arange(3)[None, :]
    for causal, w in ((True, (4, 2)), (False, (4, 2)), (False, 3)):
        want = reference_attention(q, k, v, is_causal=causal, local_window_size=w, query_positions=pos,
                                   key_value_seq_lengths=lengths)
        got = reference_decode_attention(q, k, v, lengths, causal=causal, local_window_size=w)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # causal: right changes nothing (the masks AND, as jax.nn's)
    np.testing.assert_array_equal(reference_decode_attention(q, k, v, lengths, local_window_size=(4, 0)),
                                  reference_decode_attention(q, k, v, lengths, local_window_size=(4, 9)))


def test_masked_paths_match_float64_under_jit():
    q, k, v = random_qkv(3, 4, 32, 4, 2, 16, "float32", seed=2)
    lengths = [32, 4, 19]
    f = jax.jit(functools.partial(attnlab.decode_attention, causal=False, implementation="xla",
                                  local_window_size=(6, 1)))
    out = f(q, k, v, jnp.array(lengths))
    assert check_decode_close(out, q, k, v, lengths, causal=False, local_window_size=(6, 1)).ok
    # T = 1 causal also needs the mask: without it the window would be lost
    f = jax.jit(functools.partial(attnlab.decode_attention, implementation="naive", local_window_size=2))
    out = f(q[:, :1], k, v, jnp.array(lengths))
    assert check_decode_close(out, q[:, :1], k, v, lengths, local_window_size=2).ok


@pytest.mark.parametrize("bad,words", [(-1, "local_window_size must be >= 0"), ((2, -1), "both be >= 0"),
                                       ("8", "an int or a (left, right) pair"), ((1, 2, 3), "(left, right) pair")])
def test_bad_windows_raise_named_errors(bad, words):
    q, k, v = random_qkv(1, 2, 8, 2, 2, 8, "float32")
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        attnlab.decode_attention(q, k, v, jnp.array([8]), local_window_size=bad)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        attnlab.serving_attention(q[0], k, v, np.array([0, 2]), np.array([8]), local_window_size=bad)


def test_backends_without_a_decode_window_refuse_naming_it():
    q, k, v = random_qkv(2, 2, 16, 4, 2, 16, "float32")
    ex = attnlab.explain_decode(q, k, v, jnp.array([16, 5]), local_window_size=4)
    assert ex.chosen in ("naive", "xla") and ex.reasons["attnlab-decode"] is None
    assert "local_window_size" in ex.reasons["tokamax-xla"]
    with pytest.raises(UnsupportedError, match="local_window_size"):
        attnlab.decode_attention(q, k, v, jnp.array([16, 5]), local_window_size=4, implementation="tokamax-xla")


# ---------------------------------------------------------------- the decode kernel

DECODE_CASES = {  # B, T, S, N, K, H, dtype, lengths, causal, window, config, page size, soft cap
    # window < cache for 96 and 50, > cache for 4; soft cap
    "gqa4-ragged-softcap": (3, 4, 96, 8, 2, 16, "bfloat16", [96, 4, 50], True, (5, 0), dict(block_k=16, num_splits=2),
                            None, 3.0),
    # paged (block_k 16 > page 8: the per-key gather); right bounds non-causal rows; window > cache for 17
    "paged-noncausal-right": (2, 3, 64, 4, 1, 32, "float16", [64, 17], False, (20, 2), dict(block_k=16, num_splits=3),
                              8, None),
}


@pytest.mark.parametrize("case", list(DECODE_CASES))
def test_kernel_matches_float64_and_skips_the_blocks_before_the_window(case, monkeypatch):
    """Through decode_attention under jit with traced lengths (the plan sees no lengths: the window's span)."""
    B, T, S, N, K, H, dtype, lengths, causal, w, cfg, page, cap = DECODE_CASES[case]
    window = (w, w) if isinstance(w, int) else w
    q, k, v = random_qkv(B, T, S, N, K, H, dtype, seed=len(case))
    firsts = [kd.window_start(n, T, window) for n in lengths]   # blocks start at the window's first key itself
    kp, vp, table = poisoned(k, firsts), poisoned(v, firsts), None
    if page:
        kp, vp, table = to_pages(kp, vp, page)
    monkeypatch.setattr(backends.get("attnlab-decode"), "config", kd.DecodeConfig(**cfg))
    run = jax.jit(functools.partial(attnlab.decode_attention, causal=causal, implementation="attnlab-decode",
                                    logits_soft_cap=cap, local_window_size=w))
    out = run(q, kp, vp, jnp.array(lengths), page_table=table)
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    verdict = check_decode_close(out, q, k, v, lengths, causal=causal, logits_soft_cap=cap, local_window_size=w)
    assert verdict.ok, verdict


def test_plan_splits_only_the_windows_blocks():
    # gpt-oss's 128-token window in a 32k cache: 3 blocks of 64 per sequence, not 512
    visited = kd.blocks_visited([32768, 200], num_splits=2, block_k=64, q_len=1, window=(128, 0))
    assert [sum(x) for x in visited] == [3, 3]
    full = kd.make_plan(8, 1, 32768, 32, 8, 128, "bfloat16", sms=132)
    windowed = kd.make_plan(8, 1, 32768, 32, 8, 128, "bfloat16", sms=132, window=(128, 0))
    assert windowed.num_splits == 1 < full.num_splits
    # the splits cut the window's blocks, from its first one, each read by exactly one split
    for n in (32768, 200, 50):
        lo = kd.window_start(n, 4, (300, 0))
        ranges = [kd.split_range(n, j, num_splits=3, block_k=64, lo=lo) for j in range(3)]
        blocks = [b for first, count in ranges for b in range(first, first + count)]
        assert blocks == list(range(lo // 64, -(-n // 64)))


def test_a_short_windows_plan_takes_blocks_of_16_one_warp_and_one_split():
    """gpt-oss's heads, B = 128, W = 128 (results/gpu-2026-12-06b-window-tuning): the defaults' 128-key blocks and 4
    warps ran at 42%; blocks of 16 and one warp at 84% in one split (4 stages) and 58% in two (2 or 3 stages: two
    blocks of start-up at any block size picked two)."""
    gpt_oss = dict(sms=132, compute_capability=(9, 0), window=(128, 0))
    plan = kd.make_plan(128, 1, 131072, 64, 8, 64, "bfloat16", **gpt_oss)
    assert (plan.block_k, plan.num_warps, plan.num_stages, plan.num_splits) == (16, 1, 3, 1) and plan.direct
    for other in (dict(window=None), dict(window=(8192, 0)), dict(compute_capability=(8, 0))):   # not measured
        p = kd.make_plan(128, 1, 131072, 64, 8, 64, "bfloat16", **{**gpt_oss, **other})
        assert (p.block_k, p.num_warps) == (128, 4)
    assert kd.make_plan(128, 1, 131072, 32, 8, 128, "bfloat16", **gpt_oss).block_k == 64   # H = 128: not measured
    assert kd.make_plan(128, 4, 131072, 64, 8, 64, "bfloat16", **gpt_oss).block_k == 128   # 32 rows: two tiles' worth
    given = kd.make_plan(128, 1, 131072, 64, 8, 64, "bfloat16", kd.DecodeConfig(block_k=64, num_warps=2), **gpt_oss)
    assert (given.block_k, given.num_warps) == (64, 2)


# ---------------------------------------------------------------- the serving kernel and its plan

# request 3 (6 new tokens at 58..63 of 64) under a window of 40: its prefill tile runs block 1 masked (the
# last row's window starts at 23), block 2 unmasked (every row sees all of it) and block 3 masked
Q_LEN, KV = np.array([1, 12, 3, 6, 20]), np.array([7, 40, 3, 64, 33])
S_SERVE = 64


def serving_batch(N, K, H=16, seed=0):
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0], np.cumsum(Q_LEN)]).astype(np.int32)
    T = int(starts[-1]) + 3
    q = rng.standard_normal((T, N, H)).astype(np.float32)
    k, v = (rng.standard_normal((len(KV), S_SERVE, K, H)).astype(np.float32) for _ in range(2))
    return q, k, v, starts, KV.astype(np.int32)


def unit_keys(pos0, r0, q_len, G, block_r, left, bk, from_key=True):
    """(first key, block count) of a windowed unit (request at pos0, rows r0..): its first row's window start
    (or that key's block) up to its last row's position."""
    t_last = (min(r0 + block_r, q_len * G) - 1) // G
    lo = max(0, pos0 + r0 // G - left)
    lo = lo if from_key else lo // bk * bk
    return lo, -(-(pos0 + t_last + 1 - lo) // bk)


@pytest.mark.parametrize("page,block_r", [(None, None), (16, None), (None, 16)],
                         ids=["from-key", "pages-of-block_k", "prefill-tiles-of-16-rows"])
def test_serving_plan_starts_each_unit_at_its_first_visible_key(page, block_r):
    """Contiguous (and pages < block_k): each unit's blocks from its first row's window start; pages of >= block_k
    keys: from that key's block (one page's rows). Prefill tiles of 16 rows: a request's tiles each from their own
    first row's."""
    q, _, _, starts, kv = serving_batch(8, 2)
    left, G, bk = 5, 4, 16
    kw = dict(total_tokens=q.shape[0], kv_len_max=S_SERVE, heads=8, kv_heads=2, head_dim=16, window_left=left,
              config=sp.ServingConfig(block_k=bk, decode_max_q=4, programs=3, block_r_prefill=block_r), page_size=page)
    plan = sp.make_serving_plan(starts, kv, **kw)
    # the same body under jit from traced lengths (jax.numpy) gives the same pieces
    traced = (jax.jit(lambda a, b: sp.make_serving_plan(a, b, **kw))(jnp.asarray(starts), jnp.asarray(kv))
              if page is None else plan)
    blocks = sp.FIELDS.index("blocks")
    for cp, tp in zip(plan.classes, traced.classes):
        assert cp.window_from_key == (page is None)
        live = np.asarray(cp.pieces)[np.asarray(cp.pieces)[:, blocks] > 0]
        dev = np.asarray(tp.pieces)
        np.testing.assert_array_equal(live, dev[dev[:, blocks] > 0])
        seen = {}
        for b, _, row_off, _, _, _, kv0, first, count in live.tolist():
            seen.setdefault((b, row_off, kv0), []).extend(range(first, first + count))
        want = {}
        for b in np.flatnonzero((Q_LEN <= 4) if cp.decode else (Q_LEN > 4)):
            for r0 in range(0, Q_LEN[b] * G, cp.block_r):
                lo, n = unit_keys(kv[b] - Q_LEN[b], r0, Q_LEN[b], G, cp.block_r, left, bk, from_key=page is None)
                want[(b, r0, lo)] = list(range(n))
        assert {key: sorted(x) for key, x in seen.items()} == want


def test_serving_plan_reads_fewer_blocks_from_the_first_key():
    """A 128-key window at T=4 in blocks of 128 (H=64): 2 blocks a request from its first key, 3 from the block
    boundary before it where that key lies at >= 125 of its block (``ServingConfig(window_from_key=False)``, the
    layout it replaced, which also fetched the keys of that block before the window)."""
    kv = np.array([1000, 258, 1282, 3842, 131, 2000], np.int32)
    starts = np.arange(0, 4 * kv.size + 1, 4, dtype=np.int32)
    total = {}
    for from_key in (True, False):
        plan = sp.make_serving_plan(starts, kv, total_tokens=int(starts[-1]), kv_len_max=4096, heads=32, kv_heads=8,
                                    head_dim=64, window_left=128, config=sp.ServingConfig(window_from_key=from_key))
        (cp,) = plan.classes
        assert cp.block_k == 128 and cp.window_from_key == from_key
        total[from_key] = int(np.asarray(cp.pieces)[:, sp.FIELDS.index("blocks")].sum())
    want = {f: sum(unit_keys(n - 4, 0, 4, 4, 16, 128, 128, f)[1] for n in kv) for f in (True, False)}
    assert total == want and total[True] == 2 * kv.size and total[False] == 2 * kv.size + 3


@pytest.mark.parametrize("window,page", [(5, None), ((40, 2), 8), (5, 16)], ids=["contiguous", "paged8", "paged16"])
def test_serving_kernel_matches_float64_and_skips_the_keys_before_the_window(window, page):
    """Contiguous and pages of 8 < block_k: every key before each request's first window start is NaN; pages of
    16 = block_k: every block before its block (the plan made for the pages)."""
    N, K = 8, 2
    q, k, v, starts, kv = serving_batch(N, K, seed=3)
    ref = reference_serving_attention(q, k, v, starts, kv, logits_soft_cap=2.5, local_window_size=window)
    left = window if isinstance(window, int) else window[0]
    step_block = 16 if page == 16 else 1
    firsts = [(max(0, n - t - left) // step_block) * step_block for n, t in zip(kv, Q_LEN)]
    assert any(f % 16 for f in firsts) or page == 16     # a first key inside a block: the block's start is poisoned
    kp, vp, table = poisoned(k, firsts), poisoned(v, firsts), None
    if page:
        kp, vp, table = to_pages(kp, vp, page)
    # pages of 8: a decode and a prefill class (the prefill tile's masked / unmasked / masked blocks); else one
    cfg = sp.ServingConfig(block_k=16, decode_max_q=4 if page == 8 else 32, programs=3)

    def step(q, k, v, a, b, t, page_size=page):
        plan = attnlab.serving_plan(a, b, total_tokens=q.shape[0], kv_len_max=S_SERVE, heads=N, kv_heads=K,
                                    head_dim=16, dtype="float32", config=cfg, local_window_size=window,
                                    page_size=page_size)
        return attnlab.serving_attention(q, k, v, a, b, page_table=t, logits_soft_cap=2.5, plan=plan,
                                         implementation="attnlab-decode", local_window_size=window)

    # eager, the plan made on the host (interpret mode compiles a jitted step slowly; the traced plan is
    # checked equal to the host's in test_serving_plan_starts_each_unit_at_its_first_visible_key)
    out = np.asarray(step(q, kp, vp, starts, kv, table), np.float64)
    limit, rule = tolerance(np.dtype("float32"))
    assert np.all(np.isfinite(out)) and rel_l2(out, ref) <= limit, rule
    if page == 16:      # a plan made for a contiguous cache starts inside a page's block: refused, naming page_size
        with pytest.raises(ValueError, match="pass page_size=16 to serving_plan"):
            step(q, kp, vp, starts, kv, table, page_size=None)
        # without plan=, the kernel's own plan (block_k 64 here) is made for the call's pages (traced only)
        k64, v64, t64 = to_pages(k, v, 64)
        jax.eval_shape(lambda q, k, v: attnlab.serving_attention(q, k, v, starts, kv, page_table=t64,
                                                                 implementation="attnlab-decode",
                                                                 local_window_size=window), q, k64, v64)
    if not page:
        xla = jax.jit(functools.partial(attnlab.serving_attention, logits_soft_cap=2.5, implementation="xla",
                                        local_window_size=window))(q, k, v, jnp.asarray(starts), jnp.asarray(kv))
        assert rel_l2(np.asarray(xla, np.float64), ref) <= limit


def test_serving_plan_must_be_made_for_the_calls_window():
    q, k, v, starts, kv = serving_batch(8, 2)
    plan = attnlab.serving_plan(starts, kv, total_tokens=q.shape[0], kv_len_max=S_SERVE, heads=8, kv_heads=2,
                                head_dim=16)
    with pytest.raises(ValueError, match="plan was made for local_window_size left=None, this call's is 4"):
        attnlab.serving_attention(q, k, v, starts, kv, plan=plan, local_window_size=4)


# ---------------------------------------------------------------- the cost of the window

def test_serving_cost_counts_the_windows_pairs_and_keys():
    """Against a brute-force count of the reference's visibility rule, request by request."""
    _, _, _, starts, kv = serving_batch(8, 2)
    for left in (0, 3, 17, 1000):
        pairs = keys = 0
        for t, n in zip(Q_LEN, kv):
            pos = n - t + np.arange(t)[:, None]
            s = np.arange(n)[None, :]
            vis = (s <= pos) & (s >= pos - left)
            pairs, keys = pairs + int(vis.sum()), keys + int(vis.any(0).sum())
        assert serving_cost.causal_pairs(starts, kv, left) == pairs
        assert int(serving_cost.keys_read(starts, kv, left).sum()) == keys
        want_bytes = 2 * keys * 2 * 16 * 2 + 2 * Q_LEN.sum() * 8 * 16 * 2
        assert serving_cost.serving_bytes(starts, kv, 8, 2, 16, 2, left) == want_bytes
    assert serving_cost.causal_pairs(starts, kv, 1000) == serving_cost.causal_pairs(starts, kv)


def test_decode_roofline_counts_the_windows_bytes():
    full = attnlab_decode.kv_bytes([32768, 100], 8, 128, 2)
    windowed = attnlab_decode.kv_bytes([32768, 100], 8, 128, 2, q_len=4, window=(128, 0))
    assert full == 2 * 32868 * 8 * 128 * 2 and windowed == 2 * (132 + 100) * 8 * 128 * 2
    assert attnlab_decode.roofline_ms([32768], 4, 32, 8, 128, 2, window=(128, 0)) < attnlab_decode.roofline_ms(
        [32768], 4, 32, 8, 128, 2) / 100


# ---------------------------------------------------------------- sweep cells

def test_windowed_decode_cells_through_the_sweep_engine():
    """--window on decode cells: the cell runs decode_attention's window, is checked against float64 at absolute
    positions and counts only the window's pairs and keys; a backend without a decode window is refused."""
    from attnlab.measure import Cell, Options, measure_cell
    from attnlab.sweep.spec import Sweep

    sw = Sweep(backends=["xla", "tokamax-xla"], batch=[2], q_len=[2], kv_len=[64], heads=[4], kv_heads=[2],
               head_dim=[16], dtype=["float32"], causal=[True], window=[(8, 0)], lengths=["ragged"])
    xla, tok = sw.cells()
    assert xla.window == (8, 0) and xla.lengths == "ragged"
    work, whole = xla.workload, dataclasses.replace(xla, window=None).workload
    assert work.counts().pairs == sum(min(p, 8) + 1 for n in xla.kv_lengths() for p in (n - 2, n - 1))
    assert work.kv_bytes() == 2 * sum(min(n, 10) for n in xla.kv_lengths()) * 2 * 16 * 4 < whole.kv_bytes()
    opts = Options(repeats=1, warmup=0, pipelined_calls=1, min_time_s=0.0)
    rec = measure_cell(xla, opts)
    assert rec["status"] == "ok" and rec["checked_fraction"] == 1.0 and rec["window"] == [8, 0], rec["reason"]
    rec = measure_cell(tok, opts)
    assert rec["status"] == "unsupported" and "local_window_size" in rec["reason"]
    # a native backend's decode path would read the window top-left: the cell refuses it before it runs
    from attnlab.measure.inputs import window_refusal
    assert "local_window_size" in window_refusal(backends.get("torch-flash"), (8, 0))
    assert window_refusal(backends.get("torch-flash"), None) is None
    assert window_refusal(backends.get("xla"), (8, 0)) is None


def test_windowed_kernels_lower_to_triton_for_cuda_without_a_gpu():
    """Pallas -> Triton IR lowering of the windowed decode kernel (paged) and the serving kernel (its prefill
    class: the masked / unmasked / masked loops), on the CPU: what the GPU will compile."""
    s = jax.ShapeDtypeStruct
    B, T, S, N, K, H = 4, 4, 4096, 32, 8, 128
    plan = kd.make_plan(B, T, S, N, K, H, "bfloat16", sms=132, compute_capability=(9, 0), window=(128, 0))
    dec = jax.jit(functools.partial(kd.decode_attention_pallas, interpret=False, plan=plan, window=(128, 0)))
    pages = s((B * S // 16, 16, K, H), jnp.bfloat16)
    dec_args = (s((B, T, N, H), jnp.bfloat16), pages, pages, s((B,), jnp.int32))
    starts, kv = np.array([0, 300, 301], np.int32), np.array([2000, 77], np.int32)
    splan = attnlab.serving_plan(starts, kv, total_tokens=320, kv_len_max=S, heads=N, kv_heads=K, head_dim=H,
                                 local_window_size=128)
    serve = jax.jit(lambda q, k, v: serving_attention_pallas(q, k, v, None, None, plan=splan, interpret=False))
    cache = s((2, S, K, H), jnp.bfloat16)
    with kd.cuda_lowering_context():
        texts = [dec.trace(*dec_args, page_table=s((B, S // 16), jnp.int32)).lower(lowering_platforms=("cuda",)),
                 serve.trace(s((320, N, H), jnp.bfloat16), cache, cache).lower(lowering_platforms=("cuda",))]
    for lowered in texts:
        assert "__gpu$xla.gpu.triton" in lowered.as_text() or "triton_kernel_call" in lowered.as_text()
