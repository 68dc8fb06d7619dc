"""The Mosaic GPU decode kernel's launch plan (``kernels.decode_mgpu``): tiles, steps, splits, and when it runs.

Measured on the H200 (results/gpu-2026-12-04c-mgpu): above 64 rows per KV head on sm_90 it beats the
Triton kernel (``pick_kernel``); 128-key steps with the partial O stored from registers.
"""
from __future__ import annotations

import dataclasses
import operator

from .decode_splits import cdiv, choose_num_splits, split_range

BLOCK_Q = 64                    # rows per compute warpgroup (one wgmma M)
COMPUTE_WGS = 2
TILE_ROWS = BLOCK_Q * COMPUTE_WGS
SMEM_BYTES = 227 * 1024
#: T*G from which the plan picks this kernel on sm_90: at 64 rows the Triton kernel is faster (82-89 vs
#: 80-84% of the roofline), from 112 rows this one (78-83% vs 59-63%, later 84-89%; 51-62% vs 34-41%
#: at 224-512 rows), results/gpu-2026-12-04c-mgpu.
MOSAIC_MIN_ROWS = 65


@dataclasses.dataclass(frozen=True)
class MgpuPlan:
    """One launch of the Mosaic GPU decode kernel."""

    rows: int           # T * G
    row_tiles: int      # ceil(rows / 128)
    block_kv: int       # keys per pipeline step
    max_steps: int      # K/V blocks in flight (shared-memory buffers)
    num_splits: int
    stage_out: bool = False  # True: partial O through shared memory (TMA store); False: from registers


def smem_bytes(block_kv: int, max_steps: int, head_dim: int, itemsize: int = 2, stage_out: bool = False) -> int:
    """Shared memory of one program: q tiles, K and V buffers, m and l (and the float32 output tiles)."""
    q = TILE_ROWS * head_dim * itemsize
    kv = 2 * max_steps * block_kv * head_dim * itemsize
    out = (TILE_ROWS * head_dim * 4 if stage_out else 0) + 2 * TILE_ROWS * 4
    return q + kv + out


def unsupported(q_len: int, kv_len: int, heads: int, kv_heads: int, head_dim: int, dtype: str,
                block_kv: int = 64, compute_capability=None, page_size: int | None = None,
                soft_cap=None, quantized: bool = False) -> str | None:
    """Why this kernel cannot run the shape, or None (``compute_capability`` None: not asked)."""
    if compute_capability is not None and tuple(compute_capability) != (9, 0):
        return f"mosaic decode: wgmma needs sm_90 (Hopper), device is sm_{compute_capability[0]}{compute_capability[1]}"
    if str(dtype) not in ("float16", "bfloat16"):
        return f"mosaic decode: dtype {dtype} is not float16/bfloat16"
    if head_dim not in (64, 128):
        return f"mosaic decode: head dim {head_dim} not in (64, 128)"
    if kv_len % block_kv:
        return f"mosaic decode: kv length {kv_len} not a multiple of {block_kv}"
    if page_size is not None and (page_size < 16 or page_size & (page_size - 1)):
        return f"mosaic decode: page size {page_size} is not a power of two >= 16"
    if soft_cap is not None:
        return "mosaic decode: soft cap runs on the Triton kernel"
    if quantized:
        return "mosaic decode: a quantized cache runs on the Triton kernel"
    return None


def default_block_kv(kv_len: int) -> int:
    return 128 if kv_len % 128 == 0 else 64


def make_mgpu_plan(batch: int, q_len: int, kv_len: int, heads: int, kv_heads: int, head_dim: int, *,
                   block_kv: int | None = None, max_steps: int | None = None, num_splits: int | None = None,
                   stage_out: bool = False, sms: int = 132, window=None) -> MgpuPlan:
    """Tiles, pipeline depth (what fits 227 KB) and the split count (one program per SM); with a sliding
    ``window`` (left, right) the splits cut the window's span (at most T + left + block_kv keys), not S.

    Defaults as measured on the H200 (results/gpu-2026-12-04c-mgpu/run2): 128 keys a step (64 when
    S is not a multiple of 128), partial O stored from registers (the shared-memory staging
    buffer would leave no room for two 128-key steps), as many steps as fit.
    """
    block_kv = block_kv or default_block_kv(kv_len)
    rows = q_len * (heads // kv_heads)
    tiles = cdiv(rows, TILE_ROWS)

    def fits(steps):   # Mosaic GPU adds ~3.2 KB (barriers, alignment) to the buffers counted here
        return smem_bytes(block_kv, steps, head_dim, stage_out=stage_out) <= SMEM_BYTES - 4096

    if max_steps is None:
        max_steps = 2
        while max_steps < 6 and fits(max_steps + 1):
            max_steps += 1
    if not fits(max_steps):
        raise ValueError(f"mosaic decode: {max_steps} steps of {block_kv} keys (H={head_dim}) exceed shared memory")
    if num_splits is None:
        span = kv_len if window is None else min(kv_len, q_len + int(window[0]) + block_kv)
        num_splits = choose_num_splits(span, batch * kv_heads, rows=rows, block_k=block_kv, head_dim=head_dim,
                                       row_tiles=tiles, sm_count=sms, occupancy=1,
                                       min_blocks_per_split=max(4, max_steps))
    return MgpuPlan(rows=rows, row_tiles=tiles, block_kv=block_kv, max_steps=max_steps, num_splits=int(num_splits),
                    stage_out=stage_out)


def program_blocks(length, split, *, q_len: int, block_kv: int, num_splits: int, causal: bool, window=None,
                   tokens=None, div=operator.floordiv, minimum=min, maximum=max):
    """(first block, count, lead, free) of one program: it reads blocks first .. first + count - 1 of a
    sequence of ``length`` valid keys (with a ``window`` (left, right), only from the block of the window's
    first key, max(0, length - T - left), on); its steps [lead, free) are visible to every row and need no
    mask, those before (keys before some row's window) and after (the causal or valid-length edge) do.
    ``tokens`` (first, last): the query tokens of the program's row tile (None: all T). Under the causal rule
    its blocks end at its last token's position and its unmasked ones at its first token's, so the row tiles
    of a long T (a prefill chunk) read the causal triangle, not the whole square; a window starts at its first
    token's window.
    Python ints (the tests) or, with ``div=lax.div`` etc., traced int32 scalars (the kernel)."""
    t_first, t_last = (0, q_len - 1) if tokens is None else tokens
    lo = None if window is None else maximum(length - q_len + t_first - int(window[0]), 0)
    end = maximum(length - q_len + t_last + 1, 0) if causal else length
    first, count = split_range(end, split, num_splits=num_splits, block_k=block_kv, div=div, minimum=minimum,
                               maximum=maximum, lo=lo)
    # keys below ``limit``: visible to the right edge of every row of the tile
    limit = length - q_len + t_first + 1 if causal else length
    if window is not None and not causal:
        limit = minimum(limit, length - q_len + 1 + int(window[1]))
    lead = 0
    if window is not None:    # the tile's last row's window starts at its position - left: blocks before it are masked
        seen_by_all = div(maximum(length - q_len + t_last - int(window[0]), 0) + block_kv - 1, block_kv)
        lead = minimum(maximum(seen_by_all - first, 0), count)
    free = minimum(maximum(div(maximum(limit - first * block_kv, 0), block_kv), lead), count)
    return first, count, lead, free


def pick_kernel(q_len: int, kv_len: int, heads: int, kv_heads: int, head_dim: int, dtype: str, *,
                compute_capability, page_size: int | None = None, soft_cap=None, requested: str | None = None,
                window=None, quantized: bool = False) -> str:
    """"mosaic" or "triton": the requested kernel, else Mosaic GPU above ``MOSAIC_MIN_ROWS`` rows where it runs.
    A windowed call (``window`` not None) runs Mosaic GPU only when requested: its default waits for a GPU
    measurement (``benchmarks/decode/window_gpu.py --kernels``).

    Raises ``ValueError`` when "mosaic" is requested for a call it cannot run (with the reason).
    """
    why = unsupported(q_len, kv_len, heads, kv_heads, head_dim, dtype, block_kv=default_block_kv(kv_len),
                      compute_capability=compute_capability, page_size=page_size, soft_cap=soft_cap,
                      quantized=quantized)
    if requested == "mosaic":
        if why:
            raise ValueError(why)
        return "mosaic"
    if requested not in (None, "triton"):
        raise ValueError(f"kernel must be 'triton', 'mosaic' or None, got {requested!r}")
    auto = requested is None and compute_capability is not None and not why and window is None
    return "mosaic" if auto and q_len * (heads // kv_heads) >= MOSAIC_MIN_ROWS else "triton"
