"""Split counts for ragged batches: the decode grid simulated with each sequence's own length.

``choose_num_splits`` (``kernels.decode_plan``) sizes the splits for S_max, the cache's capacity: right
for a uniform batch, but in a ragged one the programs of short sequences finish early (they loop
over their own valid blocks, ``split_range``) and the longest sequence's programs are the critical
path. When the lengths are known when the kernel is traced (concrete, not a tracer: a sweep's
closed-over lengths, an eager call), ``choose_num_splits_ragged`` picks the split count whose
simulated makespan is shortest: the grid's programs in launch order (kv head, batch outer; split;
row tile inner) go to the first free of ``sm_count x occupancy`` program slots, each costing its
blocks plus ``FILL_BLOCKS``, times the partial outputs' extra traffic (as the uniform rule).
A uniform batch gets exactly ``choose_num_splits``'s count. Traced lengths keep the S_max rule.

Status: modelled, not yet measured on the H200 (issue 25, item 4: cuDNN 0.115 vs attnlab 0.135 ms at
ragged T = 1, B=8, S=32768, GQA 32/8).
"""
from __future__ import annotations

import heapq

#: Split counts tried besides the uniform rule's own (keeps the simulation to ~15 grid models).
CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def makespan(lengths, kv_heads: int, splits: int, *, block_k: int, row_tiles: int, slots: int,
             fill_blocks: int) -> int:
    """Simulated time of the grid in block-loads: list scheduling of its programs on ``slots`` slots."""
    from .decode_plan import split_range

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
                             max_splits: int = 128) -> int:
    """The split count for these concrete ``lengths`` (see the module docstring); ``uniform_choice`` is
    ``choose_num_splits``'s count for S_max, returned unchanged when all lengths are equal."""
    from .decode_plan import FILL_BLOCKS, cdiv

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

    def cost(s):
        span = makespan(lengths, kv_heads, s, block_k=block_k, row_tiles=row_tiles, slots=slots,
                        fill_blocks=FILL_BLOCKS)
        return span * (1 + s * partial / kv_bytes)

    tried = sorted({s for s in CANDIDATES if s <= cap} | {min(uniform_choice, cap)})
    best = min(tried, key=lambda s: (round(cost(s), 6), s))
    return cdiv(n_blocks, cdiv(n_blocks, best))
