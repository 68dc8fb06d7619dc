"""Split counts: how many programs share one (batch, KV head)'s keys, and which blocks each reads.

``choose_num_splits`` sizes the splits for S_max, the cache's capacity, by whole waves of programs
(``wave_cost``): right for a uniform batch. In a ragged one the programs of short sequences finish early
(they loop over their own valid blocks, ``split_range``) and the longest sequence's programs are the
critical path. When the lengths are known when the kernel is traced (concrete, not a tracer: a sweep's
closed-over lengths, an eager call), ``choose_num_splits_ragged`` picks the split count whose
simulated makespan is shortest: the grid's programs in launch order (kv head, batch outer; split;
row tile inner) go to the first free of ``sm_count x occupancy`` program slots, each costing its
blocks plus ``fill_blocks``, times the partial outputs' extra traffic (as the uniform rule).
A uniform batch gets exactly ``choose_num_splits``'s count. Traced lengths keep the S_max rule.
With ``direct_output`` (the Triton kernel's one-split launch, ``kernels.decode_direct``) one split costs its
waves alone: no partials and no second kernel; more splits pay the partials' traffic and the combine's start-up
(one more ``fill_blocks``). Without it (the Mosaic GPU kernel, or the path forced off) every count pays the partials.
``kernels.decode_plan`` calls both when it makes a launch plan.
"""
from __future__ import annotations

import heapq
import operator

FILL_BLOCKS = 2         # a program's pipeline start-up, counted in blocks of work (of 32 keys or more)
#: The start-up is latency, not bytes: blocks shorter than 32 keys count more of them, FILL_KEYS // block_k. The
#: combine, a second kernel, counts as one more start-up (its bytes are the partials' traffic, counted apart).
#: With 2 at any block size a 128-key window in blocks of 16 split in two, 3 kernels at 0.0121-0.0122 ms where one
#: split (4 stages) ran in 0.0084 ms (gpt-oss heads, B = 128; results/gpu-2026-12-06b-window-tuning)
FILL_KEYS = 64


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def fill_blocks(block_k: int) -> int:
    """A program's start-up (and the combine's), in blocks of ``block_k`` keys: ``FILL_BLOCKS`` at 32 keys or more."""
    return max(FILL_BLOCKS, FILL_KEYS // block_k)


def wave_cost(splits: int, n_blocks: int, programs_per_split: int, slots: int, fill: int = FILL_BLOCKS) -> int:
    """Model of the kernel's time in block-loads of one program: the programs run in
    ceil(P / slots) waves, each as long as one program (its blocks plus ``fill``, the pipeline's start-up)."""
    waves = cdiv(programs_per_split * splits, slots)
    return waves * (cdiv(n_blocks, splits) + fill)


def split_factor(splits: int, partial: float, kv_bytes: float, direct_output: bool,
                 fill: int = FILL_BLOCKS) -> tuple[float, int]:
    """(traffic factor, added blocks) of a launch with ``splits``: 1 + the partials' bytes over the KV bytes and
    the combine's start-up (``fill``); (1, 0) for one split stored directly (``direct_output``)."""
    if direct_output and splits == 1:
        return 1.0, 0
    return 1 + splits * partial / kv_bytes, fill


def choose_num_splits(kv_len: int, batch_kv_heads: int, *, rows: int, block_k: int, head_dim: int,
                      row_tiles: int = 1, itemsize: int = 2, sm_count: int = 132, occupancy: int = 2,
                      min_blocks_per_split: int = 4, max_partial_fraction: float = 0.25,
                      max_splits: int = 128, direct_output: bool = False) -> int:
    """How many programs share one (batch, kv head)'s keys (flash-decoding's split count).

    The grid has P = B*K*row_tiles*splits programs of equal work and the GPU holds
    ``sm_count * occupancy`` of them at once; the split count minimises ``wave_cost`` (whole
    waves times the length of one program, so a last wave that is nearly empty costs as much
    as a full one) times (1 + the partial outputs' traffic relative to the KV bytes: T*G rows
    x (H + 2) float32, written and read once per split) plus the combine's start-up, preferring fewer splits on a
    tie; with ``direct_output`` one split pays neither (``split_factor``).
    Each split keeps at least ``min_blocks_per_split`` blocks and the partial traffic stays
    within ``max_partial_fraction`` of the KV bytes.
    The result is rounded to the count the block chunking really uses (no split empty at
    full length). Always in [1, min(ceil(S / block_k), max_splits)].
    """
    n_blocks = cdiv(kv_len, block_k)
    per_split = max(1, batch_kv_heads * row_tiles)
    slots = max(1, sm_count * occupancy)
    by_blocks = max(1, n_blocks // min_blocks_per_split)
    kv_bytes = 2 * kv_len * head_dim * itemsize            # K and V of one (b, kv head)
    partial = 2 * rows * (head_dim + 2) * 4                 # partials written + read, per split
    by_traffic = max(1, int(max_partial_fraction * kv_bytes // partial))
    cap = max(1, min(by_blocks, by_traffic, max_splits, n_blocks))
    fill = fill_blocks(block_k)

    def cost(s):
        factor, combine = split_factor(s, partial, kv_bytes, direct_output, fill)
        return wave_cost(s, n_blocks, per_split, slots, fill) * factor + combine

    best = min(range(1, cap + 1), key=lambda s: (round(cost(s), 6), s))
    return cdiv(n_blocks, cdiv(n_blocks, best))


def split_range(length, split, *, num_splits: int, block_k: int, div=operator.floordiv,
                minimum=min, maximum=max, lo=None):
    """(first block, number of blocks) that split ``split`` reads of a sequence of ``length`` keys.

    The valid blocks, from the block of key ``lo`` (the first key any query sees: a sliding window's
    start, ``window_start``; None: 0) to ceil(length / block_k), are cut into ``num_splits`` runs of
    ceil(blocks / num_splits); the last runs may be short or empty. Works on Python ints
    (the grid model) and, with ``div=lax.div`` etc., on traced int32 scalars (the kernel).
    """
    first_block = 0 if lo is None else div(lo, block_k)
    n_blocks = div(length + (block_k - 1), block_k) - first_block
    per = div(n_blocks + (num_splits - 1), num_splits)
    first = split * per
    count = minimum(maximum(n_blocks - first, 0), per)
    return first + first_block, count


#: Split counts tried besides the uniform rule's own (keeps the simulation to ~15 grid models).
CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def makespan(lengths, kv_heads: int, splits: int, *, block_k: int, row_tiles: int, slots: int,
             fill_blocks: int) -> int:
    """Simulated time of the grid in block-loads: list scheduling of its programs on ``slots`` slots."""
    free = [0] * max(1, slots)
    for n in lengths:
        counts = [split_range(int(n), j, num_splits=splits, block_k=block_k)[1] for j in range(splits)]
        for _ in range(kv_heads):
            for c in counts:
                cost = c + fill_blocks if c else 1      # a program past the end only starts and exits
                for _ in range(row_tiles):
                    heapq.heapreplace(free, free[0] + cost)
    return max(free)


def choose_num_splits_ragged(lengths, kv_heads: int, *, uniform_choice: int, rows: int, block_k: int, head_dim: int,
                             row_tiles: int = 1, itemsize: int = 2, sm_count: int = 132, occupancy: int = 2,
                             min_blocks_per_split: int = 4, max_partial_fraction: float = 0.25,
                             max_splits: int = 128, direct_output: bool = False) -> int:
    """The split count for these concrete ``lengths`` (see the module docstring); ``uniform_choice`` is
    ``choose_num_splits``'s count for S_max, returned unchanged when all lengths are equal."""
    lengths = [int(n) for n in lengths]
    if len(set(lengths)) <= 1:
        return uniform_choice
    n_blocks = cdiv(max(lengths), block_k)
    mean_len = sum(lengths) / len(lengths)
    kv_bytes = 2 * max(mean_len, 1) * head_dim * itemsize           # K and V of an average (b, kv head)
    partial = 2 * rows * (head_dim + 2) * 4
    by_blocks = max(1, n_blocks // min_blocks_per_split)
    by_traffic = max(1, int(max_partial_fraction * kv_bytes // partial))
    cap = max(1, min(by_blocks, by_traffic, max_splits, n_blocks))
    slots = max(1, sm_count * occupancy)

    fill = fill_blocks(block_k)

    def cost(s):
        span = makespan(lengths, kv_heads, s, block_k=block_k, row_tiles=row_tiles, slots=slots, fill_blocks=fill)
        factor, combine = split_factor(s, partial, kv_bytes, direct_output, fill)
        return span * factor + combine

    tried = sorted({s for s in CANDIDATES if s <= cap} | {min(uniform_choice, cap)})
    best = min(tried, key=lambda s: (round(cost(s), 6), s))
    return cdiv(n_blocks, cdiv(n_blocks, best))
