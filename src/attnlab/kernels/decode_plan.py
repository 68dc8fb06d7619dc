"""The decode kernel's launch plan: tuning parameters, the split count, what the kernel supports.

Tuning parameters (``DecodeConfig``; None = the default)
    block_k    keys per loop step: 128 for H <= 64, 64 for H = 128, 32 for H = 256; 16 for a short window
               (``short_window``)
    block_r    query rows per tile: next power of two >= max(T*G, 16), at most 128 (64 at H = 256);
               one 256-row tile (8 warps) measured slower than two 128-row tiles on the H200 at
               T*G = 256 (0.78 vs 0.72 ms, results/gpu-2026-12-04-decode), so it is not the default
    num_warps  4, or 8 when block_r * (H + block_k) > 12288 (float32 acc + scores past ~96 registers);
               1 for a short window
    num_stages 3 (software pipeline depth of the K/V loads; 2 before Hopper), given or default
               clamped to what fits one program's shared memory (``fit_stages``: 227 KB on
               Hopper, with ``SMEM_SLACK`` for Triton's allocation beyond the estimate)
    num_splits from ``choose_num_splits(S, B*K, ...)`` (``kernels.decode_splits``): the count that fills the GPU's program
               slots (SMs x ``programs_per_sm``, estimated from shared memory and registers)
               in the fewest whole waves, weighed against the partial outputs' traffic
               (<= 25% of the KV bytes), at least 4 blocks per split. With lengths known at
               trace time and ragged, ``choose_num_splits_ragged`` instead (the grid
               simulated with each sequence's own length; modelled, not yet measured). With a
               sliding window (``window``) both count only the window's blocks (``window_span``).
               One split stored directly (``direct_output``) pays no partials and no combine.
    direct_output  True (the default): a one-split launch stores O itself, one kernel (``Plan.direct``,
               ``kernels.decode_direct``); False: partials + combine always
"""
from __future__ import annotations

import dataclasses
import operator

from .decode_resources import fit_stages, programs_per_sm, sm_count
from .decode_splits import cdiv, choose_num_splits, choose_num_splits_ragged, split_range

HEAD_DIMS = (16, 32, 64, 128, 256)
DTYPES = ("float16", "bfloat16", "float32")
MAX_ROWS = 512          # T * G beyond this is prefill, not decode: use a flash-attention kernel
MIN_ROWS = 16           # the MMA's minimum M
#: The longest sliding window (left keys) ``short_window`` tunes for: the longest measured
SHORT_WINDOW_MAX = 4096


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Tuning parameters; None means the default for the shape (see the module docstring)."""

    block_k: int | None = None
    block_r: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    num_splits: int | None = None
    #: "triton", "mosaic" (``kernels.decode_mgpu``, sm_90) or None: the plan's choice by rows
    kernel: str | None = None
    #: a quantized cache's products: "float16" (``kv_dequant.mma_query``), "q" (in q's dtype) or None: float16
    #: for FP8 caches and bfloat16 queries (e4m3 1.13-1.39x faster at T=1 on the H200,
    #: results/gpu-2026-12-05c-kv-products), q's dtype otherwise (int8: float16 was slower)
    kv_mma: str | None = None
    #: True: a launch with one split normalises O in registers and stores it in q's dtype, one kernel
    #: (``kernels.decode_direct``); False: every launch writes float32 partials and XLA combines them. 1.04-1.23x
    #: on an H100's one-split windows (results/gpu-2026-12-05d-h100-merge-direct); its GPU test (sinks, FP8, T > 1:
    #: tests/gpu/test_decode_direct_gpu.py) passed on the H200 (results/gpu-2026-12-06-prefill-slots)
    direct_output: bool = True
    #: True: an FP8 cache with float16 products is read as 16-bit pairs of bytes along H, split into its even and
    #: odd columns in registers (``kv_dequant.byte_planes``): 16-byte copies and ldmatrix for V, whose FP8 bytes
    #: Triton otherwise gathers one by one (results/cpu-2026-12-06-fp8-ttgir); 1.10-1.27x on every FP8 cell of the
    #: H200 (results/gpu-2026-12-06c-fp8-pairs). False: the bytes as stored
    kv_pairs: bool = True
    #: True: the blocks every query row sees whole (inside the length, before the first row's causal limit; not
    #: with a window) run in a loop of their own without the mask's compares and selects (sm_90's loop: 10-23%
    #: fewer instructions, results/cpu-2026-12-07-whole-blocks); False (until timed on a GPU): every block masked
    whole_blocks: bool = False

    def requested_kernel(self) -> str | None:
        """The kernel asked for: ``kernel``, else "triton" where a field past ``kernel`` and ``direct_output`` tunes
        it, else None (the plan's choice). "mosaic" with such a field is a ValueError: the Mosaic GPU kernel
        takes none of them (it would run untuned without a word)."""
        tuned = [f.name for f in dataclasses.fields(self)
                 if f.name not in ("kernel", "direct_output") and getattr(self, f.name) != f.default]
        if self.kernel == "mosaic" and tuned:
            raise ValueError(f"DecodeConfig(kernel='mosaic'): {', '.join(tuned)} tune the Triton kernel; "
                             "the Mosaic GPU kernel takes none of them")
        return self.kernel or ("triton" if tuned else None)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A resolved launch: every parameter concrete, for one (B, T, S, N, K, H, dtype)."""

    rows: int           # T * G query rows per KV head
    block_r: int
    row_tiles: int
    block_k: int
    num_splits: int
    num_warps: int
    num_stages: int
    kv_mma: str | None = None     # "float16", or None: q's dtype
    direct_output: bool = False   # ``DecodeConfig.direct_output``
    kv_pairs: bool = False        # ``DecodeConfig.kv_pairs``, where it applies (FP8, float16 products)
    whole_blocks: bool = False    # ``DecodeConfig.whole_blocks``

    @property
    def grid(self) -> tuple[int, int]:
        return (self.row_tiles, self.num_splits)

    @property
    def direct(self) -> bool:
        """Whether the launch stores O itself, in q's dtype (one split, ``kernels.decode_direct``): no combine."""
        return self.direct_output and self.num_splits == 1


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): 3072 -> 4096, 4096 -> 4096."""
    return 1 << max(0, int(n) - 1).bit_length()


def window_start(length, q_len: int, window, maximum=max):
    """The first key position any of the T = ``q_len`` newest queries of a ``length``-key sequence sees
    under ``window`` (left, right): max(0, length - T - left); None when there is no window."""
    return None if window is None else maximum(length - q_len - int(window[0]), 0)


def window_base(lo, block_k: int, page_size: int | None, div=operator.floordiv):
    """(position the program's blocks start from, whether it is a multiple of block_k) for a window whose first
    visible key is ``lo`` (``window_start``; None: no window, 0). The window's first key itself where a block may
    start anywhere (contiguous caches, and pages shorter than a block, gathered key by key): the keys before it
    are never fetched (a 128-key window in blocks of 128 read 2-3 blocks when they started at block
    boundaries); the start of its block where a block is one page's contiguous rows (pages >= block_k).
    ``div``: ``lax.div`` in the kernel, on traced int32 scalars."""
    if lo is None:
        return 0, True
    if page_size is None or block_k > page_size:
        return lo, False
    return div(lo, block_k) * block_k, True


def window_span(length: int, q_len: int, window, block_k: int) -> int:
    """Keys from the first block the window touches to ``length`` (what the kernel reads, in whole blocks
    at the start): the length the split rules plan for. ``length`` itself without a window."""
    lo = window_start(length, q_len, window)
    return length if lo is None else length - (lo // block_k) * block_k


def blocks_visited(lengths, *, num_splits: int, block_k: int, q_len: int = 1, window=None) -> list[list[int]]:
    """Pure-Python model of the grid: blocks each (batch, split) program loads, per batch."""
    return [[split_range(int(n), j, num_splits=num_splits, block_k=block_k,
                         lo=window_start(int(n), q_len, window))[1] for j in range(num_splits)]
            for n in lengths]


def default_block_k(head_dim: int) -> int:
    return 128 if head_dim <= 64 else 64 if head_dim <= 128 else 32


def short_window(window, head_dim: int, block_r: int, compute_capability=None) -> bool:
    """Whether a launch is a window of <= ``SHORT_WINDOW_MAX`` keys at H <= 64 in one 16-row tile on Hopper (or a
    GPU not named, as elsewhere in the plan): blocks of 16 keys and one warp then. A window's program loops over few
    blocks, so the default's 128-key blocks and 4 warps left 3 programs a SM doing almost no pipelining. Measured
    on the H200, gpt-oss's heads, T = 1, exactly this plan against the old one
    (results/gpu-2026-12-06b-window-tuning): B = 256, W = 128 1.55-1.61x (43% -> 68-70% of the roofline
    contiguous, 39-40% -> 61-63% paged); W = 1024-4096 0.99-1.07x at B = 64-256."""
    hopper = compute_capability is None or tuple(compute_capability) >= (9, 0)    # where it was measured
    return (window is not None and int(window[0]) <= SHORT_WINDOW_MAX and head_dim <= 64
            and block_r == MIN_ROWS and hopper)


def make_plan(batch: int, q_len: int, kv_len: int, heads: int, kv_heads: int, head_dim: int, dtype="bfloat16",
              config: DecodeConfig | None = None, *, sms: int | None = None, compute_capability=None,
              lengths=None, window=None, kv_dtype: str | None = None) -> Plan:
    """Fill ``config``'s unset parameters for this shape (see the module docstring). ``lengths``: the
    batch's valid lengths when known at trace time; a ragged batch's split count then follows them
    (``kernels.decode_splits``). ``window`` (left, right): the splits cut only the window's blocks.
    ``kv_dtype``: a quantized cache's dtype (its products' dtype follows it), None for a cache in q's dtype."""
    import numpy as np  # heavy: numpy, the planner imports none

    cfg = config or DecodeConfig()
    rows = q_len * (heads // kv_heads)
    block_r = cfg.block_r or min(next_pow2(max(rows, MIN_ROWS)), 64 if head_dim > 128 else 128)
    if block_r < MIN_ROWS or block_r & (block_r - 1):
        raise ValueError(f"block_r must be a power of two >= {MIN_ROWS}, got {block_r}")
    short = short_window(window, head_dim, block_r, compute_capability)
    block_k = cfg.block_k or (16 if short else default_block_k(head_dim))
    block_k = min(block_k, max(MIN_ROWS, next_pow2(kv_len)))
    if block_k < 16 or block_k & (block_k - 1):
        raise ValueError(f"block_k must be a power of two >= 16, got {block_k}")
    row_tiles = cdiv(rows, block_r)
    # acc (block_r x H) and scores (block_r x block_k) in float32 registers: 8 warps once they pass
    # ~96 registers a thread at 4 warps (ptxas spilled at block_r=64, H=256 with 4 warps).
    num_warps = cfg.num_warps or (1 if short else 8 if block_r * (head_dim + block_k) > 12288 else 4)
    stages = cfg.num_stages or (2 if compute_capability is not None and compute_capability < (9, 0) else 3)
    itemsize = np.dtype(dtype).itemsize
    # a deeper pipeline than shared memory holds fails at launch (RESOURCE_EXHAUSTED): clamp it
    stages = fit_stages(block_r, block_k, head_dim, stages, itemsize, compute_capability)
    splits = cfg.num_splits
    if splits is None:
        occ = programs_per_sm(block_r, block_k, head_dim, num_warps, stages, itemsize)
        kw = dict(rows=rows, block_k=block_k, head_dim=head_dim, row_tiles=row_tiles, itemsize=itemsize,
                  sm_count=sms if sms is not None else sm_count(), occupancy=occ, direct_output=cfg.direct_output)
        # a window's keys: at most T + left, one block more where the window starts inside a block
        span = kv_len if window is None else min(kv_len, q_len + int(window[0]) + block_k)
        splits = choose_num_splits(span, batch * kv_heads, **kw)
        if lengths is not None:
            spans = [window_span(int(n), q_len, window, block_k) for n in lengths]
            splits = choose_num_splits_ragged(spans, kv_heads, uniform_choice=splits, **kw)
    if splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {splits}")
    kv_mma = kv_products(cfg.kv_mma, kv_dtype, dtype)
    return Plan(rows=rows, block_r=block_r, row_tiles=row_tiles, block_k=block_k, num_splits=int(splits),
                num_warps=num_warps, num_stages=stages, kv_mma=kv_mma, direct_output=bool(cfg.direct_output),
                kv_pairs=kv_pairs_apply(cfg.kv_pairs, kv_dtype, kv_mma, dtype), whole_blocks=cfg.whole_blocks)


def kv_products(kv_mma: str | None, kv_dtype: str | None, q_dtype="bfloat16") -> str | None:
    """The products' dtype of a quantized cache (``DecodeConfig.kv_mma``): "float16", or None for q's. The default
    float16 for FP8 caches and a bfloat16 q, where it was measured (float16 q: the same products)."""
    if kv_mma not in (None, "q", "float16"):
        raise ValueError(f"kv_mma must be None, 'q' or 'float16', got {kv_mma!r}")
    if kv_mma is None:
        fp8 = kv_dtype is not None and str(kv_dtype).startswith("float8")
        kv_mma = "float16" if fp8 and str(q_dtype) == "bfloat16" else "q"
    return None if kv_mma == "q" or kv_dtype is None else kv_mma


def kv_pairs_apply(kv_pairs: bool, kv_dtype: str | None, kv_mma: str | None, q_dtype) -> bool:
    """Whether ``kv_pairs`` (``DecodeConfig``'s, ``ServingConfig``'s) applies: an FP8 cache whose products are float16
    (``kv_mma``: ``kv_products``' for this cache; None: q's dtype)."""
    return (bool(kv_pairs) and str(kv_dtype).startswith("float8")
            and (kv_mma == "float16" or str(q_dtype) == "float16"))


def compiled_stages(num_stages: int, indirection_levels: int = 0) -> int:
    """Triton's ``num_stages`` that gives every load ``num_stages - 1`` iterations of prefetch.

    Triton's pipeliner (``AssignLatencies``) gives each pipelined load a latency of
    ``(num_stages - 1) // (max indirection level + 1)``: a paged K/V load whose address comes
    from a page-table load in the same iteration (level 1) gets only half the prefetch distance
    of the contiguous kernel's (1 instead of 2 at num_stages 3: one K/V buffer, 38.9 KB of
    shared memory instead of 71.7 KB, results/gpu-2026-12-04-decode/ttir_cpu). Compiling with
    ``(num_stages - 1) * (levels + 1) + 1`` restores the contiguous pipeline depth.
    """
    return (int(num_stages) - 1) * (int(indirection_levels) + 1) + 1


def unsupported(q_len: int, kv_len: int, heads: int, kv_heads: int, head_dim: int, dtype: str) -> str | None:
    """Why the kernel cannot run this shape, or None."""
    if dtype not in DTYPES:
        return f"dtype {dtype} not supported (float16, bfloat16 or float32)"
    if head_dim not in HEAD_DIMS:
        return f"head dim {head_dim} not supported (one of {', '.join(map(str, HEAD_DIMS))})"
    rows = q_len * (heads // kv_heads)
    if rows > MAX_ROWS:
        return f"T*G = {q_len}*{heads // kv_heads} = {rows} query rows per KV head > {MAX_ROWS} (not decode)"
    if q_len > kv_len:
        return f"T={q_len} > S={kv_len}: the T new tokens must fit in the cache"
    return None


