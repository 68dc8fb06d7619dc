"""serving_attention: the cost model, the float64 reference, the masked xla path, the plan and the kernel
(Pallas interpret mode), checks and explain. Kernel shapes stay tiny: interpret mode compiles slowly."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab.core.errors import UnsupportedError
from attnlab.core.serving_cost import causal_pairs, serving_bytes, serving_flops, serving_roofline_s
from attnlab.kernels import serving_plan as sp
from attnlab.kernels.pages import to_pages
from attnlab.reference.decode64 import reference_decode_attention
from attnlab.reference.serving64 import reference_serving_attention
from attnlab.reference.tolerance import rel_l2, tolerance

# (q_len per request, kv_len per request): ragged decodes, mixed prefill + decode, one token everywhere
CASES = {
    "ragged-decode": ([1, 1, 1, 1], [37, 1, 64, 9]),
    "mixed": ([1, 12, 3, 1, 20], [7, 40, 3, 64, 33]),
    "speculative": ([4, 4, 4], [4, 50, 17]),
    "one-long": ([1, 1, 1, 1], [160, 5, 9, 2]),       # the long one: 10 blocks of 16 over 5 programs
}
S = 160
BLOCKS = sp.FIELDS.index("blocks")     # a piece's block count, its column of ClassPlan.pieces


def batch(case, N, K, H=16, pad=3, dtype=np.float32, seed=0):
    q_len, kv = (np.array(x, np.int32) for x in CASES[case])
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    T = int(starts[-1]) + pad
    q = rng.standard_normal((T, N, H)).astype(dtype)
    k, v = (rng.standard_normal((len(kv), S, K, H)).astype(dtype) for _ in range(2))
    return q, k, v, starts, kv


def assert_close(out, ref, q):
    limit, rule = tolerance(np.dtype(q.dtype))
    err = rel_l2(np.asarray(out, np.float64), ref)
    assert err <= limit, f"rel L2 {err:.2e} > {limit:.2e} ({rule})"
    pad = np.asarray(out)[int(np.flatnonzero(np.abs(ref).sum(axis=(1, 2)))[-1]) + 1:]
    assert not np.any(pad), "padding tokens must give 0"


# ---------------------------------------------------------------- cost model and reference

def test_cost_counts_exactly_the_visible_pairs():
    q_len, kv = np.array([1, 5, 3]), np.array([9, 5, 30])
    starts = np.concatenate([[0], np.cumsum(q_len)])
    brute = sum(int(np.sum(np.arange(n)[None, :] <= (n - t + np.arange(t))[:, None])) for t, n in zip(q_len, kv))
    assert causal_pairs(starts, kv) == brute
    assert serving_flops(starts, kv, heads=8, head_dim=16) == 4 * 8 * 16 * brute
    assert serving_bytes(starts, kv, 8, 2, 16, 2) == 2 * 44 * 2 * 16 * 2 + 2 * 9 * 8 * 16 * 2
    # an int8 cache with a scale per KV head: 1-byte K/V, a float32 K and V scale per KV head, q and out in 2 bytes
    assert serving_bytes([0, 1], [4], 2, 2, 4, 2, kv_itemsize=1, kv_scale="head") == 2 * 4 * 2 * 4 + 2 * 4 * 2 + 2 * 2 * 4 * 2
    # B=32 decodes at 32k, G=4, H=128: bandwidth-bound, 32 x 32768 x 8 heads x 2 x 256 B / 4.8 TB/s
    big = serving_roofline_s(np.arange(33), np.full(32, 32768), 32, 8, 128)
    assert big == pytest.approx(serving_bytes(np.arange(33), np.full(32, 32768), 32, 8, 128, 2) / 4.8e12)


def test_reference_is_decode_reference_for_uniform_requests():
    q, k, v, starts, kv = batch("speculative", 8, 2, pad=0)
    got = reference_serving_attention(q, k, v, starts, kv, logits_soft_cap=2.0)
    want = reference_decode_attention(q.reshape(3, 4, 8, 16), k, v, kv, logits_soft_cap=2.0)
    np.testing.assert_allclose(got, want.reshape(12, 8, 16), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- the masked xla path

@pytest.mark.parametrize("case,heads,paged", [("ragged-decode", (4, 4), False), ("mixed", (8, 2), True),
                                               ("speculative", (14, 2), False)],
                         ids=["ragged-G1-contig", "mixed-G4-paged", "spec-G7-contig"])
def test_xla_path_matches_float64_under_jit(case, heads, paged):
    N, K = heads
    q, k, v, starts, kv = batch(case, N, K)
    cap = 2.5 if case == "mixed" else None
    ref = reference_serving_attention(q, k, v, starts, kv, logits_soft_cap=cap)
    table = None
    if paged:
        k, v, table = to_pages(k, v, 16)
    f = jax.jit(functools.partial(attnlab.serving_attention, implementation="xla", logits_soft_cap=cap))
    out = f(q, k, v, jnp.asarray(starts), jnp.asarray(kv), page_table=table)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_close(out, ref, q)


def test_a_float64_step_is_float64_accurate():
    """The masked path computes a float64 call in float64 (not float32 under a float64 label: ~1e-7)."""
    with jax.enable_x64(True):
        q, k, v, starts, kv = batch("mixed", 8, 2, dtype=np.float64)
        out = attnlab.serving_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), starts, kv, logits_soft_cap=2.5)
        assert out.dtype == jnp.float64
        assert rel_l2(np.asarray(out), reference_serving_attention(q, k, v, starts, kv, logits_soft_cap=2.5)) < 1e-12


# ---------------------------------------------------------------- the plan

@pytest.mark.parametrize("case,heads", [*((c, (8, 2)) for c in CASES), ("ragged-decode", (4, 4)), ("mixed", (4, 4))])
def test_plan_covers_every_needed_block_once_and_balances(case, heads):
    """G = 4, and G = 1 (a decode request's one row in its own tile)."""
    q, k, v, starts, kv = batch(case, *heads)
    kw = dict(total_tokens=q.shape[0], kv_len_max=S, heads=heads[0], kv_heads=heads[1], head_dim=16,
              config=sp.ServingConfig(block_k=16, decode_max_q=4, programs=3))
    host = sp.make_serving_plan(starts, kv, **kw)
    # the same body under jit from traced lengths (one compile: the mixed case; the others on the host twice)
    traced = (jax.jit(lambda a, b: sp.make_serving_plan(a, b, **kw))(jnp.asarray(starts), jnp.asarray(kv))
              if case == "mixed" else sp.make_serving_plan(starts, kv, **kw))
    G, q_len = heads[0] // heads[1], np.diff(starts)
    for cp, tp in zip(host.classes, traced.classes):
        assert cp.block_r == tp.block_r
        pieces, dev = np.asarray(cp.pieces), np.asarray(tp.pieces)
        live = pieces[pieces[:, BLOCKS] > 0]
        np.testing.assert_array_equal(live, dev[dev[:, BLOCKS] > 0])          # NumPy and jnp agree
        seen = {}
        for b, _, row_off, _, _, _, kv0, first, count in live.tolist():
            assert kv0 == 0                                                   # no window: from key 0
            seen.setdefault((b, row_off), []).extend(range(first, first + count))
        in_class = (q_len <= 4) if cp.decode else (q_len > 4)
        want = {}
        for b in np.flatnonzero(in_class):
            for r0 in range(0, q_len[b] * G, cp.block_r):
                t_last = (min(r0 + cp.block_r, q_len[b] * G) - 1) // G
                want[(b, r0)] = list(range((kv[b] - q_len[b] + t_last) // 16 + 1))
        assert {key: sorted(x) for key, x in seen.items()} == want
        st = np.asarray(cp.starts)
        per_program = [int(pieces[st[p]:st[p + 1], BLOCKS].sum()) for p in range(cp.programs)]
        chunk = max(-(-sum(per_program) // cp.programs), sp.MIN_CHUNK)
        assert sum(per_program) == int(live[:, BLOCKS].sum())                  # every piece in one program's run
        assert max(per_program) <= chunk                                   # no program longer than the chunk
        assert np.all(pieces[st[0]:st[-1], BLOCKS] > 0)                     # no run holds a piece of no block


def test_plan_weighs_a_pieces_start_in_blocks():
    """piece_blocks=k: a program starting more pieces gets fewer blocks (the most blocks + k x pieces of any
    program drops); every block is still in one run; a negative weight is refused."""
    starts, kv = np.arange(13, dtype=np.int32), np.array([300, 20, 35, 18, 40, 22, 30, 17, 25, 33, 19, 28], np.int32)
    kw = dict(total_tokens=12, kv_len_max=320, heads=8, kv_heads=2, head_dim=16)
    worst = {}
    for k in (0, 3):
        cp = sp.make_serving_plan(starts, kv, **kw, config=sp.ServingConfig(block_k=16, programs=4, piece_blocks=k)
                                  ).classes[0]
        pieces, st = np.asarray(cp.pieces), np.asarray(cp.starts)
        runs = [pieces[st[p]:st[p + 1]] for p in range(cp.programs)]
        assert sum(int(r[:, BLOCKS].sum()) for r in runs) == int(np.sum(-(-kv // 16)))
        worst[k] = max(int(r[:, BLOCKS].sum()) + 3 * len(r) for r in runs)
    assert worst[3] < worst[0] and worst[3] == 21       # 21: these weights cut in four as the plan cuts them
    with pytest.raises(ValueError, match="piece_blocks must be an int >= 0"):
        sp.make_serving_plan(starts, kv, **kw, config=sp.ServingConfig(piece_blocks=-1))
    # a static bound on q_len below a request's (concrete) tokens: that request's rows were 0 without a word
    with pytest.raises(ValueError, match=r"ServingConfig.max_q_len=2 is below request 1's 3 new tokens"):
        attnlab.serving_plan(np.array([0, 1, 4, 7]), np.array([30, 40, 10]), total_tokens=26, kv_len_max=64, heads=4,
                             kv_heads=2, head_dim=32, config=sp.ServingConfig(max_q_len=2))


@pytest.mark.parametrize("kv,programs,runs", [(176, 4, [3, 3, 3, 2]), (64, 8, [2, 2, 0, 0, 0, 0, 0, 0])])
def test_programs_runs_are_the_ceiling_of_the_blocks_over_programs_and_at_least_min_chunk(kv, programs, runs):
    """One request of kv keys (blocks of 16): each program's run is ceil(blocks / programs) blocks, never fewer than
    MIN_CHUNK = 2 (4 blocks over 8 programs: two runs of two), the last takes what is left."""
    cp = sp.make_serving_plan(np.array([0, 1], np.int32), np.array([kv], np.int32), total_tokens=1, kv_len_max=kv,
                              heads=2, kv_heads=2, head_dim=16,
                              config=sp.ServingConfig(block_k=16, programs=programs)).classes[0]
    pieces, st = np.asarray(cp.pieces), np.asarray(cp.starts)
    assert [int(pieces[st[p]:st[p + 1], BLOCKS].sum()) for p in range(cp.programs)] == runs


@pytest.mark.parametrize("groups,head_dim,rows", [(16, 128, 128), (12, 128, 128), (4, 128, 32), (16, 256, 64)])
def test_decode_tile_holds_a_requests_rows_up_to_128(groups, head_dim, rows):
    """T=8 decodes: one tile holds a request's T*G rows up to 128 (64 at H > 128), so its keys are read once."""
    starts, kv = np.arange(0, 33, 8, dtype=np.int32), np.full(4, 100, np.int32)
    plan = sp.make_serving_plan(starts, kv, total_tokens=32, kv_len_max=128, heads=2 * groups, kv_heads=2,
                                head_dim=head_dim)
    assert [c.block_r for c in plan.classes] == [rows]


@pytest.mark.parametrize("head_dim,prefill_rows", [(128, 128), (256, 64)])
def test_default_launch_sizes(head_dim, prefill_rows):
    """Requests of exactly decode_max_q tokens are decodes (one class, its tile holding their G x T rows); a longer
    one makes the prefill class, in tiles of 128 rows (64 at H > 128); at most two programs per SM over the K heads."""
    dmq, G, K = sp.ServingConfig().decode_max_q, 4, 2
    kw = dict(kv_len_max=512, heads=G * K, kv_heads=K, head_dim=head_dim, sms=132)
    starts = np.arange(0, 3 * dmq + 1, dmq, dtype=np.int32)
    only = sp.make_serving_plan(starts, np.full(3, 300, np.int32), total_tokens=3 * dmq, **kw).classes
    assert [(c.decode, c.block_r) for c in only] == [(True, min(prefill_rows, max(16, 1 << (G * dmq - 1).bit_length())))]
    mixed = sp.make_serving_plan(np.array([0, 1, 1 + 200], np.int32), np.array([300, 400], np.int32),
                                 total_tokens=201, **kw).classes
    assert [(c.decode, c.block_r) for c in mixed][1] == (False, prefill_rows)
    for c in (*only, *mixed):
        assert 132 // K <= c.programs <= 2 * 132 // K


@pytest.mark.parametrize("kv_len_max", [17, 40, 100])
def test_block_k_is_a_power_of_two_past_a_short_cache(kv_len_max):
    """Triton's block shapes are powers of two: a cache of 40 keys is read in a block of 64 (masked past 40)."""
    plan = sp.make_serving_plan(np.array([0, 1, 2], np.int32), np.array([kv_len_max, 7], np.int32), total_tokens=2,
                                kv_len_max=kv_len_max, heads=4, kv_heads=2, head_dim=16)
    assert [c.block_k for c in plan.classes] == [max(16, 1 << (kv_len_max - 1).bit_length())]


# ---------------------------------------------------------------- the kernel, Pallas interpret mode

@pytest.mark.parametrize("case,heads,paged,merge", [
    ("mixed", (14, 2), True, "kernel"), ("one-long", (8, 2), False, "kernel"), ("mixed", (8, 2), False, "fused")],
    ids=["mixed-G7-paged", "one-long-G4-contig", "mixed-G4-contig-fused"])
def test_kernel_matches_float64_under_jit(case, heads, paged, merge):
    """merge "fused": the pieces kernel merges each unit (tests/test_serving_fused.py); "kernel": a merge kernel."""
    N, K = heads
    q, k, v, starts, kv = batch(case, N, K)
    ref = reference_serving_attention(q, k, v, starts, kv, logits_soft_cap=2.5)
    table = None
    if paged:
        k, v, table = to_pages(k, v, 8)       # block_k 16 > page 8: the per-key gather
    cfg = sp.ServingConfig(block_k=16, decode_max_q=4, programs=7 if case == "one-long" else 3,
                           max_q_len=1 if case == "one-long" else None, piece_blocks=0 if case == "one-long" else 3,
                           merge=merge, whole_blocks=merge == "kernel")

    def step(q, k, v, a, b, t):
        plan = attnlab.serving_plan(a, b, total_tokens=q.shape[0], kv_len_max=S, heads=N, kv_heads=K,
                                    head_dim=16, dtype="float32", config=cfg)
        return attnlab.serving_attention(q, k, v, a, b, page_table=t, logits_soft_cap=2.5,
                                         implementation="attnlab-decode", plan=plan)

    out = jax.jit(step)(q, k, v, jnp.asarray(starts), jnp.asarray(kv), table)
    assert_close(out, ref, q)
    # the plan made as the step makes it: one class for decodes only, two for a mixed batch
    plan = attnlab.serving_plan(starts, kv, total_tokens=q.shape[0], kv_len_max=S, heads=N, kv_heads=K, head_dim=16,
                                config=cfg)
    assert len(plan.classes) == (1 if case == "one-long" else 2)
    if case == "one-long":      # the long request's unit merges its 5 pieces, none of no block
        first, end = np.asarray(plan.classes[0].units)[0, 3:5]
        assert end - first == 5 and np.all(np.asarray(plan.classes[0].pieces)[first:end, BLOCKS] > 0)


@pytest.mark.parametrize("impl", ["xla", "attnlab-decode"])
def test_invalid_traced_lengths_leave_the_other_requests_rows_right(impl):
    """Under jit the value checks cannot run: a request with kv_len past S_max, below its q_len or negative gets
    implementation-defined rows, and every other request's rows stay right (the plan clamps what it reads)."""
    N, K = 8, 2
    q, k, v, starts, kv = batch("mixed", N, K)
    bad = kv.copy()
    bad[[0, 1, 2]] = S + 50, 3, -5                 # requests 3 and 4 keep their lengths
    cfg = sp.ServingConfig(block_k=16, decode_max_q=4, programs=3)

    def step(a, b):
        plan = attnlab.serving_plan(a, b, total_tokens=q.shape[0], kv_len_max=S, heads=N, kv_heads=K, head_dim=16,
                                    config=cfg)
        return attnlab.serving_attention(q, k, v, a, b, implementation=impl, plan=plan)

    out = np.asarray(jax.jit(step)(jnp.asarray(starts), jnp.asarray(bad)), np.float64)
    ref = reference_serving_attention(q, k, v, starts, kv)
    rows = slice(starts[3], starts[5])
    assert rel_l2(out[rows], ref[rows]) <= tolerance(np.dtype(q.dtype))[0]
    assert not np.any(out[starts[5]:]), "padding tokens must give 0"


# ---------------------------------------------------------------- checks, explain, refusals

def _call(**over):
    q, k, v, starts, kv = batch("mixed", 8, 2)
    args = dict(q=q, k_cache=k, v_cache=v, q_starts=starts, kv_lengths=kv)
    args.update(over)
    return args


@pytest.mark.parametrize("over,err,words", [
    (dict(q=np.zeros((4, 8), np.float32)), ValueError, "q must have rank 3"),
    (dict(q_starts=np.array([0, 1, 13, 16, 17], np.int32)), ValueError, "q_starts must have shape (B+1,)=(6,)"),
    (dict(q_starts=np.array([0, 1, 13, 16, 17], np.int32), kv_lengths=np.array([7, 40, 3, 64], np.int32)),
     ValueError, "k_cache batch size 5 must equal kv_lengths size B=4"),
    (dict(q_starts=np.array([1, 2, 14, 17, 18, 38], np.int32)), ValueError, "q_starts[0]=1 must be 0"),
    (dict(q_starts=np.array([0, 1, 0, 17, 18, 38], np.int32)), ValueError, "q_starts must not decrease: request 1 has"),
    (dict(kv_lengths=np.array([7, 11, 3, 64, 33], np.int32)), ValueError, "kv_lengths[1]=11 must lie in [q_len, S_max]=[12, 160]"),
    (dict(kv_lengths=np.array([7, 40, 3, 161, 33], np.int32)), ValueError, "kv_lengths[3]=161"),
    (dict(q_starts=np.array([0, 1, 13, 16, 17, 60], np.int32), kv_lengths=np.array([7, 40, 3, 64, 60], np.int32)),
     ValueError, "q_starts[B]=60 must be <= q's token count T_total=40"),
    (dict(kv_lengths=np.array([7., 40, 3, 64, 33])), TypeError, "kv_lengths must be an integer array"),
    (dict(q=np.zeros((40, 7, 16), np.float32)), ValueError, "q heads N=7 must be a multiple of k_cache heads K=2"),
    (dict(q=np.zeros((40, 8, 16), np.float16)), TypeError, "must share one dtype"),
])
def test_bad_arguments_raise_named_errors(over, err, words):
    with pytest.raises(err) as e:
        attnlab.serving_attention(**_call(**over))
    assert words in str(e.value)


@pytest.mark.parametrize("starts,kv,words", [
    ([0, 2], [200], "kv_lengths[0]=200 must lie in [q_len, S_max]=[2, 160]"),
    ([0, 2], [1], "kv_lengths[0]=1 must lie in [q_len, S_max]=[2, 160]"),
    ([1, 3], [20], "q_starts[0]=1 must be 0"),
    ([0, 2], [[20, 30]], "kv_lengths must have shape (B,), got (1, 2)"),
])
def test_one_request_is_checked_as_many_are(starts, kv, words):
    args = _call()
    args.update(k_cache=args["k_cache"][:1], v_cache=args["v_cache"][:1], q_starts=np.array(starts, np.int32),
                kv_lengths=np.array(kv, np.int32))
    with pytest.raises(ValueError) as e:
        attnlab.serving_attention(**args, implementation="xla")
    assert words in str(e.value)


def test_explain_and_refusals():
    args = _call()
    ex = attnlab.explain_serving(**args)
    assert ex.chosen == "xla" and ex.reasons["xla"] is None
    assert "no serving path" in ex.reasons["naive"]
    with pytest.raises(UnsupportedError, match="naive: no serving path"):
        attnlab.serving_attention(**args, implementation="naive")
    with pytest.raises(UnsupportedError, match="attnlab-decode: scale is traced"):
        jax.jit(lambda s: attnlab.serving_attention(**args, scale=s, implementation="attnlab-decode"))(0.3)
    plan = attnlab.serving_plan(args["q_starts"], args["kv_lengths"], total_tokens=39, kv_len_max=S, heads=8,
                                kv_heads=2, head_dim=16)
    with pytest.raises(ValueError, match=r"plan was made for \(T_total, B, N, K, H\)=\(39, 5, 8, 2, 16\)"):
        attnlab.serving_attention(**args, plan=plan)


def test_a_plan_made_for_other_lengths_never_passes_as_right():
    """A stale plan (the last step's lengths, same sizes): ValueError naming plan where both are on the host; under
    jit, NaN rows that no check passes. The plan a step makes from its own traced lengths runs as before."""
    args = _call()
    old_kv = args["kv_lengths"].copy()
    old_kv[1] = 39
    stale = attnlab.serving_plan(args["q_starts"], old_kv, total_tokens=40, kv_len_max=S, heads=8, kv_heads=2,
                                 head_dim=16)
    with pytest.raises(ValueError, match=r"plan was made for other lengths: kv_lengths\[1\]=40, the plan's 39"):
        attnlab.serving_attention(**args, plan=stale)
    q, k, v, starts, kv = (args[n] for n in ("q", "k_cache", "v_cache", "q_starts", "kv_lengths"))
    run = jax.jit(lambda a, b, p: attnlab.serving_attention(q, k, v, a, b, plan=p))
    assert np.isnan(np.asarray(run(starts, kv, stale))).all()
    ref = reference_serving_attention(q, k, v, starts, kv)
    assert_close(run(starts, kv, attnlab.serving_plan(starts, kv, total_tokens=40, kv_len_max=S, heads=8, kv_heads=2,
                                                      head_dim=16)), ref, q)
    own = jax.jit(lambda a, b: attnlab.serving_attention(q, k, v, a, b, plan=attnlab.serving_plan(
        a, b, total_tokens=40, kv_len_max=S, heads=8, kv_heads=2, head_dim=16), implementation="attnlab-decode"))
    assert_close(own(starts, kv), ref, q)


def test_the_float64_truths_refuse_lengths_the_calls_refuse():
    """The references judged invalid steps without a word: a request's rows silently 0, NaN, truncated lengths."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((8, 2, 4)), rng.standard_normal((3, 16, 1, 4))
    for starts, kv, match in (([0, 5, 3, 8], [10, 10, 10], "q_starts must not decrease: request 1"),
                              ([1, 5, 6, 8], [10, 10, 10], r"q_starts\[0\]=1 must be 0"),
                              ([0, 5, 6, 8], [4, 10, 10], r"kv_lengths\[0\]=4 must lie in \[q_len, S_max\]=\[5, 16\]"),
                              ([0, 5, 6, 8], [10, 40, 10], r"kv_lengths\[1\]=40 must lie in"),
                              ([0, 5, 6, 9], [10, 10, 10], r"q_starts\[B\]=9 must be <= q's token count T_total=8")):
        with pytest.raises(ValueError, match=match):
            reference_serving_attention(q, k, k, np.array(starts), np.array(kv))
    with pytest.raises(TypeError, match="kv_lengths must be an integer array"):
        reference_serving_attention(q, k, k, np.array([0, 5, 6, 8]), np.array([10.0, 10, 10]))
    with pytest.raises(TypeError, match="kv_lengths must be integers, got dtype float64"):
        reference_decode_attention(q[None, :1], k, k, np.array([3.5, 10, 10]))
