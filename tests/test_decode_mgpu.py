"""The Mosaic GPU (wgmma) decode kernel on the CPU: JAX's GPU interpreter against float64 (K and V NaN at every
key no row sees: past the lengths, before the windows, in the page -1 table slots read), the plan's choice of
kernel, the blocks each program reads, and a compile check for sm_90 (lowering, shared memory) without a GPU."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnlab.kernels import decode as kd
from attnlab.kernels import decode_mgpu as dm
from attnlab.kernels import pages as kp
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.inputs import random_qkv


def poisoned(k, v, lengths, q_len: int, window):
    """k, v with NaN at every key that no row sees: past each length and before each window's first key. The
    kernel loads whole blocks, so the last block's tail (and a window's first block's head) reach shared memory:
    a score left unmasked is NaN, and a value left as it is gives 0 * NaN = NaN in P.V."""
    pos = np.arange(k.shape[1])[None, :]
    lo = np.array([0 if window is None else max(0, n - q_len - window[0]) for n in lengths])[:, None]
    bad = ((pos < lo) | (pos >= np.asarray(lengths)[:, None]))[:, :, None, None]
    return jnp.where(bad, jnp.nan, k), jnp.where(bad, jnp.nan, v)


def with_a_nan_page(k_pages, v_pages, table):
    """Pages with a NaN page 0 before them (the table shifted past it), which a -1 table slot reads."""
    nan = jnp.full((1,) + k_pages.shape[1:], jnp.nan, k_pages.dtype)
    shifted = np.where(np.asarray(table) >= 0, np.asarray(table) + 1, table)
    return jnp.concatenate([nan, k_pages]), jnp.concatenate([nan, v_pages]), shifted


# The GPU interpreter takes ~3 s a (batch, kv head, split) program: its cases are few, and windowed ones are the
# cheap ones (fewer blocks). It also wants every barrier phase seen: at most max_steps blocks a program.
@pytest.mark.parametrize("T, N, K, H, lengths, causal, splits, window, block_kv, pad", [
    # G = 7, a short sequence's masked tail (its second 64-row piece zeroed); the window's 2 blocks of 128 keys in
    # 2 splits, its first one masked per row (each row's window starts one key later), 103 keys before the window
    (3, 7, 1, 64, [256, 70], True, 2, (150, 0), 128, None),
    # without the causal rule: a split of two unmasked steps, a masked tail, an empty split (4 programs, not 6)
    (5, 4, 1, 64, [192, 5], False, 2, None, 64, None),
    # a prefill chunk: T=200, G=1, two row tiles, each reading only up to its last token's key (the second
    # sequence's first tile, tokens 0-127 at positions 30-157, skips its last block). ``q_first``: the first
    # sequence's first 150 tokens are padding and NaN, so its first tile (tokens 0-127) reads no key and its rows
    # are 0, not NaN; its second tile runs whole, its real rows against float64
    (200, 1, 1, 64, [256, 230], True, 1, None, 64, 150),
])
def test_interpreter_matches_float64(T, N, K, H, lengths, causal, splits, window, block_kv, pad):
    q, k, v = random_qkv(2, T, 256, N, K, H, "bfloat16", seed=T)
    plan = dm.make_mgpu_plan(2, T, 256, N, K, H, block_kv=block_kv, num_splits=splits, window=window)
    kw = dict(causal=causal, plan=plan, interpret=True, window=window)
    if pad is None:
        out = dm.decode_attention_mgpu(q, *poisoned(k, v, lengths, T, window), jnp.asarray(lengths), **kw)
        verdict = check_decode_close(out, q, k, v, lengths, causal=causal, local_window_size=window)
        assert verdict.ok, verdict
        return
    q_nan = q.at[0, :pad].set(jnp.nan)
    out = dm.decode_attention_mgpu(q_nan, *poisoned(k, v, lengths, T, window), jnp.asarray(lengths),
                                   q_first=jnp.array([pad, 0]), **kw)
    assert not np.asarray(out[0, :128], np.float32).any()
    for b, rows in ((0, slice(pad, T)), (1, slice(0, T))):
        one = lambda x: x[b:b + 1, rows]  # noqa: E731
        verdict = check_decode_close(one(out), one(q), k[b:b + 1], v[b:b + 1], lengths[b:b + 1], causal=causal)
        assert verdict.ok, (b, verdict)


@pytest.mark.parametrize("page_size, window, causal, splits", [(16, (40, 2), False, 1), (128, None, True, 2)])
def test_interpreter_paged_matches_its_contiguous_twin(page_size, window, causal, splits):
    """One TMA copy per page of 16 (four a 64-key step), or a 64-key step inside a page of 128; table
    slots past a sequence's pages hold -1, read as page 0, all NaN here (its keys are loaded and masked).
    A window's pages: only those of its first block on; without the causal rule its right side bounds row t < 2.
    The pages of 128 in 2 splits (the short sequence's second one empty); the window in one (2 programs, not 4)."""
    q, k, v = random_qkv(2, 4, 128, 4, 1, 64, "bfloat16", seed=page_size)
    lengths = [37, 128]
    kp_, vp_, table = kp.to_pages(*poisoned(k, v, lengths, 4, window), page_size)
    table = np.asarray(table).copy()
    table[0, kp.pages_in_use([37], page_size)[0]:] = -1
    kp_, vp_, table = with_a_nan_page(kp_, vp_, table)
    plan = dm.make_mgpu_plan(2, 4, 128, 4, 1, 64, block_kv=64, num_splits=splits, window=window)
    out = dm.decode_attention_mgpu(q, kp_, vp_, jnp.asarray(lengths), plan=plan, interpret=True,
                                   page_table=jnp.asarray(table), window=window, causal=causal)
    verdict = check_decode_close(out, q, k, v, lengths, local_window_size=window, causal=causal)
    assert verdict.ok, verdict


@pytest.mark.parametrize("causal", [True, False])
def test_program_blocks_read_the_window_and_leave_unmasked_only_what_every_row_sees(causal):
    """The grid model on Python ints: the splits' blocks are exactly the window's first block to the last key any
    row of the tile sees (the causal rule: its last token's position; else the last valid key), once each; a step
    without a mask holds only keys every row of the tile sees (brute force), over whole T and over row tiles of
    some of its tokens (a prefill chunk's tiles)."""
    bk = 16
    for n, T, window, splits in [(200, 1, (37, 0), 3), (192, 4, (16, 1), 2), (64, 3, (100, 5), 4), (9, 2, None, 2),
                                 (161, 5, (0, 0), 1), (200, 4, (33, 40), 5), (200, 90, None, 2), (150, 64, None, 1),
                                 (300, 80, (60, 0), 3)]:
        for tokens in [None, (0, 0), (0, T // 3), (T // 3, T // 2), (T // 2, T - 1)]:
            t0, t1 = (0, T - 1) if tokens is None else tokens
            lo = 0 if window is None else max(0, n - T + t0 - window[0])
            end = n - T + t1 + 1 if causal and T > 1 else n
            read = []
            for j in range(splits):
                first, count, lead, free = dm.program_blocks(n, j, q_len=T, block_kv=bk, num_splits=splits,
                                                             causal=causal and T > 1, window=window, tokens=tokens)
                assert 0 <= lead <= free <= count
                read += range(first, first + count)
                for b in range(first + lead, first + free):
                    for s in range(b * bk, (b + 1) * bk):
                        for t in range(t0, t1 + 1):
                            p = n - T + t
                            seen = s < n and (s <= p if causal else window is None or s <= p + window[1])
                            assert seen and (window is None or s >= p - window[0]), (n, T, window, j, b, s, t)
            assert read == list(range(lo // bk, -(-end // bk))), (n, T, window, tokens)


def test_the_plan_picks_mosaic_above_64_rows_on_hopper_only():
    pick = dm.pick_kernel
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=(9, 0)) == "mosaic"     # 112 rows
    assert pick(16, 32768, 32, 8, 128, "bfloat16", compute_capability=(9, 0)) == "triton"     # 64 rows
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=(8, 0)) == "triton"
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=None) == "triton"       # CPU
    assert pick(16, 32768, 28, 4, 256, "bfloat16", compute_capability=(9, 0)) == "triton"
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=(9, 0), page_size=16) == "mosaic"
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=(9, 0), page_size=8) == "triton"
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=(9, 0), soft_cap=30.0) == "triton"
    assert pick(16, 32768, 28, 4, 128, "float32", compute_capability=(9, 0)) == "triton"
    assert pick(2, 1024, 8, 8, 64, "float16", compute_capability=(9, 0), requested="mosaic") == "mosaic"
    # a window: the Triton kernel unless Mosaic GPU is asked for (its default waits for a GPU measurement)
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=(9, 0), window=(128, 0)) == "triton"
    assert pick(1, 32768, 8, 1, 64, "bfloat16", compute_capability=(9, 0), window=(128, 0),
                requested="mosaic") == "mosaic"
    with pytest.raises(ValueError, match="head dim 256"):
        pick(2, 1024, 8, 8, 256, "bfloat16", compute_capability=(9, 0), requested="mosaic")
    with pytest.raises(ValueError, match="kernel must be"):
        pick(2, 1024, 8, 8, 64, "bfloat16", compute_capability=(9, 0), requested="cuda")
    # a quantized cache: the Triton kernel, and a request for Mosaic GPU says why not (it ran Triton silently)
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=(9, 0), quantized=True) == "triton"
    with pytest.raises(ValueError, match="quantized cache runs on the Triton kernel"):
        pick(2, 1024, 8, 8, 64, "bfloat16", compute_capability=(9, 0), requested="mosaic", quantized=True)


def test_decode_attention_pallas_runs_the_requested_mosaic_kernel():
    q, k, v = random_qkv(1, 2, 128, 4, 1, 64, "float16", seed=0)

    def run(kernel):
        return kd.decode_attention_pallas(q, k, v, jnp.asarray([100]), interpret=True,
                                          config=kd.DecodeConfig(kernel=kernel))
    # the Mosaic GPU kernel runs in JAX's GPU interpreter, the Triton one under its own name
    assert "InterpretGPUParams" in str(jax.make_jaxpr(lambda: run("mosaic"))())
    assert "attnlab_decode_r" in str(jax.make_jaxpr(lambda: run("triton"))())
    assert check_decode_close(run("mosaic"), q, k, v, [100]).ok

    def windowed(kernel):   # traced only: a windowed call takes the Mosaic GPU kernel only when asked
        return str(jax.make_jaxpr(lambda: kd.decode_attention_pallas(
            q, k, v, jnp.asarray([100]), interpret=True, window=(40, 0), config=kd.DecodeConfig(kernel=kernel)))())
    assert "InterpretGPUParams" in windowed("mosaic") and "attnlab_decode_r" in windowed(None)


def test_a_config_says_which_kernel_it_asks_for():
    """Triton's tiles ask for the Triton kernel; with kernel="mosaic" they are an error (they would be ignored)."""
    assert kd.DecodeConfig().requested_kernel() is None
    assert kd.DecodeConfig(direct_output=False).requested_kernel() is None
    assert kd.DecodeConfig(whole_blocks=True).requested_kernel() == "triton"
    assert kd.DecodeConfig(kernel="mosaic", direct_output=False).requested_kernel() == "mosaic"
    q, k, v = random_qkv(1, 2, 128, 4, 1, 64, "float16", seed=0)
    with pytest.raises(ValueError, match="block_r, num_warps tune the Triton kernel"):
        kd.decode_attention_pallas(q, k, v, jnp.asarray([100]), interpret=True,
                                   config=kd.DecodeConfig(kernel="mosaic", block_r=16, num_warps=2))


def test_a_windowed_plan_splits_the_window_not_the_cache():
    full = dm.make_mgpu_plan(1, 1, 131072, 64, 8, 64)
    windowed = dm.make_mgpu_plan(1, 1, 131072, 64, 8, 64, window=(128, 0))
    assert windowed.num_splits == 1 < full.num_splits


@pytest.mark.parametrize("T, N, K, H", [(16, 28, 4, 128), (64, 32, 8, 128), (32, 64, 4, 128), (8, 64, 8, 64)])
def test_default_plans_lower_for_sm90_within_shared_memory(T, N, K, H):
    """Mosaic GPU checks shared memory when it lowers: every default plan of the grid fits 227 KB."""
    B, S = 8, 32768
    plan = dm.make_mgpu_plan(B, T, S, N, K, H)
    q = jax.ShapeDtypeStruct((B, T, N, H), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((B, S, K, H), jnp.bfloat16)
    with kd.cuda_lowering_context():
        text = jax.jit(lambda q, k, v, n: dm.decode_attention_mgpu(q, k, v, n, plan=plan)).trace(
            q, kv, kv, jax.ShapeDtypeStruct((B,), jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text
    assert plan.row_tiles == -(-T * (N // K) // 128) and plan.block_kv == 128


@pytest.mark.parametrize("T, N, K, H, window, causal, page", [(1, 64, 8, 64, (128, 0), True, None),
                                                              (16, 28, 4, 128, (1000, 3), False, 16)])
def test_windowed_kernels_lower_for_sm90(T, N, K, H, window, causal, page):
    """The window's masks and loops compile for sm_90 (register layouts, wgmma), contiguous and paged."""
    B, S = 4, 8192
    q = jax.ShapeDtypeStruct((B, T, N, H), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((B * S // page, page, K, H) if page else (B, S, K, H), jnp.bfloat16)
    table = [jax.ShapeDtypeStruct((B, S // page), jnp.int32)] if page else []

    def f(q, k, v, n, *t):
        return dm.decode_attention_mgpu(q, k, v, n, causal=causal, window=window, page_table=t[0] if t else None)
    with kd.cuda_lowering_context():
        text = jax.jit(f).trace(q, kv, kv, jax.ShapeDtypeStruct((B,), jnp.int32), *table).lower(
            lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


def test_a_plan_past_shared_memory_is_refused():
    with pytest.raises(ValueError, match="exceed shared memory"):
        dm.make_mgpu_plan(8, 16, 32768, 28, 4, 128, block_kv=128, max_steps=3)
