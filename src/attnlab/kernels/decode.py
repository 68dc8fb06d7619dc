"""attnlab's decode attention kernel in Pallas (Triton lowering): T = 1..64 new tokens against a KV cache.

Semantics (the append / verification rule of FlashInfer and vLLM)
    q (B, T, N, H); k, v caches (B, S, K, H) with S = S_max; ``lengths`` (B,) int, the valid
    length of each cache *including* the T new tokens (T <= lengths[b] <= S).
    Query t of batch b sits at position ``lengths[b] - T + t``. With ``causal`` it attends the
    keys at positions ``<= lengths[b] - T + t``; without, every valid key ``< lengths[b]``.
    Keys at positions ``>= lengths[b]`` are never read and never attended. No row is empty
    (query t always sees key 0). Output (B, T, N, H) in q's dtype.

Layout and grid
    GQA packing: the T*G query rows that share one KV head (G = N // K) form one tile's rows,
    row r = t * G + g (q is re-laid out as (B, K, T*G, H): a free reshape at T = 1, a small
    transpose of q otherwise). So every KV byte is read once per row tile, and a row tile has
    ``block_r`` rows (a power of two >= 16, the MMA minimum; rows past T*G are masked).
    grid = (row_tiles, num_splits, B*K), axis 0 fastest: the row tiles of one KV chunk are
    launched together, so when T*G > block_r the second tile finds the chunk in L2.
    Flash-decoding: program (r, j, b*K + h) reads split j of batch b's *valid* keys,
    ``split_range(lengths[b], j)``: the valid blocks ceil(lengths[b] / block_k) are cut into
    ``num_splits`` equal runs of whole blocks, so a short sequence's programs loop fewer times
    (a ragged batch reads what it holds, rounded up to block_k per sequence; programs past the
    end do no loads). Inside a program an online softmax (exp2, float32 scores, running max
    and sum) streams block_k keys at a time: S = q k^T (bf16/fp16 MMA, float32 accumulation),
    P = exp2(S - m) rounded to the input dtype, O += P v (float32 accumulation).
    Each program writes its unnormalised partial O (float32), running max m and sum l; a
    second step in jax.numpy (fused by XLA) combines the splits by log-sum-exp:
    O = sum_j 2^(m_j - M) O_j / sum_j 2^(m_j - M) l_j with M = max_j m_j.

What is read from HBM
    KV: ceil(lengths[b] / block_k) * block_k rows of (H,) per (b, kv head), K and V once each
    (the masked tail of the last block is not fetched); q once per split; partials
    (B, K, splits, T*G, H+2) float32 written then read by the combine (weighed by the split rule;
    ~1% at T*G = 16, at most 25%).

Why Triton and not Mosaic GPU
    The kernel is bandwidth-bound up to T*G ~ 200 rows (arithmetic intensity T*N/K FLOP/byte,
    ridge ~206 on the H200); what it needs is masked loads against per-batch valid lengths,
    a dynamic trip count and deep software pipelining (``num_stages``), all of which Triton
    gives directly on Ampere and Hopper alike. Its tiles are at most 128 x block_k, where
    wgmma/TMA (Mosaic GPU's strengths, Hopper only) buy little; and the Triton lowering runs
    in Pallas interpret mode on the CPU, which is how the tests check it. Compiled for sm_90 by
    Triton 3.6 (``benchmarks/decode_ttir_cpu.py``, no GPU needed), the default tiles use
    mma.sync at 16-32 rows and wgmma from 64 rows, cp.async pipelines for K and V, 70-128 KB
    of shared memory and no register spills. Caveat: JAX 0.11 marks the Pallas Triton backend
    deprecated (a DeprecationWarning at lowering) in favour of Mosaic GPU; it still ships and
    works there, and a Mosaic GPU port is the way forward if it is removed.

Tuning parameters (``DecodeConfig``; None = the default)
    block_k    keys per loop step: 128 for H <= 64, 64 for H = 128, 32 for H = 256
    block_r    query rows per tile: next power of two >= max(T*G, 16), at most 128 (64 at H = 256);
               one 256-row tile (8 warps) measured slower than two 128-row tiles on the H200 at
               T*G = 256 (0.78 vs 0.72 ms, results/gpu-2026-12-04-decode), so it is not the default
    num_warps  4, or 8 when block_r * (H + block_k) > 12288 (float32 acc + scores past ~96 registers)
    num_stages 3 (software pipeline depth of the K/V loads; 2 before Hopper), given or default
               clamped to what fits one program's shared memory (``fit_stages``: 227 KB on
               Hopper, with ``SMEM_SLACK`` for Triton's allocation beyond the estimate)
    num_splits from ``choose_num_splits(S, B*K, ...)``: the count that fills the GPU's program
               slots (SMs x ``programs_per_sm``, estimated from shared memory and registers)
               in the fewest whole waves, weighed against the partial outputs' traffic
               (<= 25% of the KV bytes), at least 4 blocks per split. With lengths known at
               trace time and ragged, ``decode_splits.choose_num_splits_ragged`` instead (the grid
               simulated with each sequence's own length; modelled, not yet measured).
Paged caches (``page_table``): ``paged_load.load_kv_block`` reads each block through the table.
SM count: ``sm_count()``: the device's ``core_count`` where jaxlib exposes it, else a table by
device kind (132 for H100/H200/GH200 SXM, 108 for A100, ...), else 108; on the CPU (interpret
mode, which runs programs one after another) 8, to keep the grid small.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import operator

from ..masking import large_negative_value

LOG2E = math.log2(math.e)
HEAD_DIMS = (16, 32, 64, 128, 256)
DTYPES = ("float16", "bfloat16", "float32")
MAX_ROWS = 512          # T * G beyond this is prefill, not decode: use a flash-attention kernel
MIN_ROWS = 16           # the MMA's minimum M

#: SMs by device kind (substring match, first hit wins). Used when the device has no core_count.
SM_COUNTS = (("H100 PCIe", 114), ("H100", 132), ("H200", 132), ("H800", 132), ("GH200", 132),
             ("B200", 148), ("B300", 148), ("A100", 108), ("A800", 108), ("A10", 72), ("A30", 56),
             ("L40", 142), ("L4", 58), ("RTX 4090", 128))
DEFAULT_SM_COUNT = 108
CPU_SM_COUNT = 8
#: Masked scores and the running max of a row that has seen no key: jax.nn's finite large negative
#: (``attnlab.masking``), never -inf, so the kernel's outputs (partial m) hold no Inf.
NEG = large_negative_value("float32")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Tuning parameters; None means the default for the shape (see the module docstring)."""

    block_k: int | None = None
    block_r: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    num_splits: int | None = None


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

    @property
    def grid(self) -> tuple[int, int]:
        return (self.row_tiles, self.num_splits)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def sm_count(device=None) -> int:
    """Streaming multiprocessors of ``device`` (default: JAX's first device); see the docstring."""
    import jax

    d = device if device is not None else jax.devices()[0]
    if d.platform != "gpu":
        return CPU_SM_COUNT
    n = getattr(d, "core_count", None)
    if isinstance(n, int) and n > 0:
        return n
    kind = str(getattr(d, "device_kind", ""))
    for name, count in SM_COUNTS:
        if name in kind:
            return count
    return DEFAULT_SM_COUNT


SMEM_PER_SM = 228 * 1024     # Hopper; Ampere A100 has 164 KB (only lowers the estimate's occupancy)
REGS_PER_SM = 65536
#: Shared memory one program (CTA) may opt into: 227 KB on Hopper (sm_90), 163 KB on A100 (sm_80),
#: 99 KB on other sm_8x parts (CUDA programming guide, "Features and Technical Specifications").
SMEM_PER_BLOCK = {(9, 0): 227 * 1024, (8, 0): 163 * 1024}
SMEM_PER_BLOCK_OTHER_SM8X = 99 * 1024
#: ``smem_bytes`` under-counts what Triton 3.6 allocates by up to ~14% (measured on the H200: block_k=128,
#: H=128, 4 stages estimated 245760 B, allocated 278528 B): plans keep this margin below the limit.
SMEM_SLACK = 1.15
FILL_BLOCKS = 2              # a program's pipeline start-up, counted in blocks of work


def smem_bytes(block_r: int, block_k: int, head_dim: int, num_stages: int, itemsize: int = 2) -> int:
    """Shared memory of one program: (stages - 1) K and V blocks in flight, q, P (within ~15% of
    what Triton 3.6 allocates for this kernel on sm_90; ``benchmarks/decode_ttir_cpu.py``)."""
    return (max(1, num_stages - 1) * 2 * block_k * head_dim + 2 * block_r * head_dim + block_r * block_k) * itemsize


def smem_limit(compute_capability=None) -> int:
    """Bytes of shared memory one program may use on this compute capability (None: Hopper)."""
    cc = tuple(compute_capability) if compute_capability is not None else (9, 0)
    if cc >= (9, 0):
        return SMEM_PER_BLOCK[(9, 0)]
    return SMEM_PER_BLOCK.get(cc, SMEM_PER_BLOCK_OTHER_SM8X)


def fit_stages(block_r: int, block_k: int, head_dim: int, num_stages: int, itemsize: int = 2,
               compute_capability=None) -> int:
    """The deepest pipeline <= ``num_stages`` whose shared memory (with ``SMEM_SLACK``) fits one program.

    Raises ValueError when even 2 stages do not fit (block_k or block_r too large for this head dim)."""
    limit = smem_limit(compute_capability)
    stages = num_stages
    while stages > 2 and smem_bytes(block_r, block_k, head_dim, stages, itemsize) * SMEM_SLACK > limit:
        stages -= 1
    need = smem_bytes(block_r, block_k, head_dim, stages, itemsize) * SMEM_SLACK
    if need > limit:
        raise ValueError(f"block_r={block_r}, block_k={block_k} at head dim {head_dim} need ~{int(need)} B of shared "
                         f"memory with {stages} stages > {limit} B per program: use a smaller block_k or block_r")
    return stages


def programs_per_sm(block_r: int, block_k: int, head_dim: int, num_warps: int, num_stages: int,
                    itemsize: int = 2) -> int:
    """Estimated resident programs per SM, from shared memory and registers (fitted to ptxas on sm_90:
    ~60 + 1.25 x the float32 acc + scores elements a thread holds)."""
    by_smem = SMEM_PER_SM // (smem_bytes(block_r, block_k, head_dim, num_stages, itemsize) + 1024)
    threads = 32 * num_warps
    regs = 60 + 1.25 * block_r * (head_dim + block_k) / threads
    regs = min(255, 8 * math.ceil(regs / 8))
    by_regs = REGS_PER_SM // (regs * threads)
    return max(1, min(by_smem, by_regs, 64 // num_warps))


def wave_cost(splits: int, n_blocks: int, programs_per_split: int, slots: int) -> int:
    """Model of the kernel's time in block-loads of one program: the programs run in
    ceil(P / slots) waves, each as long as one program (its blocks plus pipeline fill)."""
    waves = cdiv(programs_per_split * splits, slots)
    return waves * (cdiv(n_blocks, splits) + FILL_BLOCKS)


def choose_num_splits(kv_len: int, batch_kv_heads: int, *, rows: int, block_k: int, head_dim: int,
                      row_tiles: int = 1, itemsize: int = 2, sm_count: int = 132, occupancy: int = 2,
                      min_blocks_per_split: int = 4, max_partial_fraction: float = 0.25,
                      max_splits: int = 128) -> int:
    """How many programs share one (batch, kv head)'s keys (flash-decoding's split count).

    The grid has P = B*K*row_tiles*splits programs of equal work and the GPU holds
    ``sm_count * occupancy`` of them at once; the split count minimises ``wave_cost`` (whole
    waves times the length of one program, so a last wave that is nearly empty costs as much
    as a full one) times (1 + the partial outputs' traffic relative to the KV bytes: T*G rows
    x (H + 2) float32, written and read once per split), preferring fewer splits on a tie.
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
    def cost(s):
        return wave_cost(s, n_blocks, per_split, slots) * (1 + s * partial / kv_bytes)

    best = min(range(1, cap + 1), key=lambda s: (round(cost(s), 6), s))
    return cdiv(n_blocks, cdiv(n_blocks, best))


def split_range(length, split, *, num_splits: int, block_k: int, div=operator.floordiv,
                minimum=min, maximum=max):
    """(first block, number of blocks) that split ``split`` reads of a sequence of ``length`` keys.

    The ceil(length / block_k) valid blocks are cut into ``num_splits`` runs of
    ceil(blocks / num_splits); the last runs may be short or empty. Works on Python ints
    (the grid model) and, with ``div=lax.div`` etc., on traced int32 scalars (the kernel).
    """
    n_blocks = div(length + (block_k - 1), block_k)
    per = div(n_blocks + (num_splits - 1), num_splits)
    first = split * per
    count = minimum(maximum(n_blocks - first, 0), per)
    return first, count


def blocks_visited(lengths, *, num_splits: int, block_k: int) -> list[list[int]]:
    """Pure-Python model of the grid: blocks each (batch, split) program loads, per batch."""
    return [[split_range(int(n), j, num_splits=num_splits, block_k=block_k)[1] for j in range(num_splits)]
            for n in lengths]


def default_block_k(head_dim: int) -> int:
    return 128 if head_dim <= 64 else 64 if head_dim <= 128 else 32


def make_plan(batch: int, q_len: int, kv_len: int, heads: int, kv_heads: int, head_dim: int, dtype="bfloat16",
              config: DecodeConfig | None = None, *, sms: int | None = None, compute_capability=None,
              lengths=None) -> Plan:
    """Fill ``config``'s unset parameters for this shape (see the module docstring). ``lengths``: the
    batch's valid lengths when known at trace time; a ragged batch's split count then follows them
    (``kernels.decode_splits``)."""
    import numpy as np

    cfg = config or DecodeConfig()
    rows = q_len * (heads // kv_heads)
    block_r = cfg.block_r or min(next_pow2(max(rows, MIN_ROWS)), 64 if head_dim > 128 else 128)
    if block_r < MIN_ROWS or block_r & (block_r - 1):
        raise ValueError(f"block_r must be a power of two >= {MIN_ROWS}, got {block_r}")
    block_k = cfg.block_k or default_block_k(head_dim)
    block_k = min(block_k, max(MIN_ROWS, next_pow2(kv_len)))
    if block_k < 16 or block_k & (block_k - 1):
        raise ValueError(f"block_k must be a power of two >= 16, got {block_k}")
    row_tiles = cdiv(rows, block_r)
    # acc (block_r x H) and scores (block_r x block_k) in float32 registers: 8 warps once they pass
    # ~96 registers a thread at 4 warps (ptxas spilled at block_r=64, H=256 with 4 warps).
    num_warps = cfg.num_warps or (8 if block_r * (head_dim + block_k) > 12288 else 4)
    stages = cfg.num_stages or (2 if compute_capability is not None and compute_capability < (9, 0) else 3)
    itemsize = np.dtype(dtype).itemsize
    # a deeper pipeline than shared memory holds fails at launch (RESOURCE_EXHAUSTED): clamp it
    stages = fit_stages(block_r, block_k, head_dim, stages, itemsize, compute_capability)
    splits = cfg.num_splits
    if splits is None:
        occ = programs_per_sm(block_r, block_k, head_dim, num_warps, stages, itemsize)
        kw = dict(rows=rows, block_k=block_k, head_dim=head_dim, row_tiles=row_tiles, itemsize=itemsize,
                  sm_count=sms if sms is not None else sm_count(), occupancy=occ)
        splits = choose_num_splits(kv_len, batch * kv_heads, **kw)
        if lengths is not None:
            from .decode_splits import choose_num_splits_ragged

            splits = choose_num_splits_ragged(lengths, kv_heads, uniform_choice=splits, **kw)
    if splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {splits}")
    return Plan(rows=rows, block_r=block_r, row_tiles=row_tiles, block_k=block_k, num_splits=int(splits),
                num_warps=num_warps, num_stages=stages)


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


def cuda_lowering_context(device_kind: str = "NVIDIA H200", cores: int = 132):
    """A context in which ``jit(...).trace(...).lower(lowering_platforms=("cuda",))`` works without a GPU.

    JAX <= 0.10 lowers Pallas Triton kernels for sm_90 when no GPU is present; JAX >= 0.11 asks
    for an abstract GPU device, given here through an abstract mesh (JAX-private API, so a
    no-op context where it is missing). For checking the lowering on a CPU only.
    """
    import contextlib

    import jax

    try:
        from jax._src.mesh import AbstractDevice

        mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(device_kind, cores, "gpu"))
        return jax.sharding.use_abstract_mesh(mesh)
    except (ImportError, TypeError, AttributeError):
        return contextlib.nullcontext()


def _kernel(len_ref, *refs, q_len: int, groups: int, rows: int, kv_len: int, block_r: int, block_k: int,
            num_splits: int, causal: bool, qk_scale: float, page_size: int | None = None,
            soft_cap: float | None = None):
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    from .paged_load import load_kv_block

    # paged: refs start with this sequence's page table row, and k_ref / v_ref are (P * page_size, H)
    table_ref, (q_ref, k_ref, v_ref, o_ref, m_ref, l_ref) = (refs[0], refs[1:]) if page_size else (None, refs)
    H = q_ref.shape[-1]
    tile, split = pl.program_id(0), pl.program_id(1)
    # Lengths are clamped to [0, S]: under jit they are not checked, and nothing past S is ever read.
    length = jnp.minimum(jnp.maximum(len_ref[0], 0), kv_len)
    row = tile * block_r + lax.iota(jnp.int32, block_r)
    row_ok = row < rows
    q = plgpu.load(q_ref, mask=jnp.broadcast_to(row_ok[:, None], (block_r, H)), other=0)
    first, count = split_range(length, split, num_splits=num_splits, block_k=block_k,
                               div=lax.div, minimum=jnp.minimum, maximum=jnp.maximum)
    q_pos = length - q_len + lax.div(row, groups)          # position of each row's query
    cols = lax.iota(jnp.int32, block_k)

    def body(i, carry):
        acc, m, l = carry
        start = pl.multiple_of((first + i) * block_k, block_k)
        pos = start + cols
        kv_ok = pos < length
        load = functools.partial(load_kv_block, start=start, kv_ok=kv_ok, length=length, block_k=block_k,
                                 page_size=page_size, table_ref=table_ref)
        k = load(k_ref)
        s = plgpu.dot(q, k, trans_b=True) * qk_scale        # (block_r, block_k) float32, log2 units
        if soft_cap is not None:                             # cap * tanh(x / cap), cap in log2 units too
            s = soft_cap * jnp.tanh(s / soft_cap)
        visible = kv_ok[None, :]
        if causal:
            visible = visible & (pos[None, :] <= q_pos[:, None])
        s = jnp.where(visible, s, NEG)                       # finite, as jax.nn (attnlab.masking)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))           # NEG for rows that have seen no key yet
        # Such rows subtract 0 instead, so 2^(NEG - 0) = 0 keeps their l = 0 and acc = 0. A per-row
        # select: a second per-element select on p cost 7-55% at T = 16-64 on the H200 (2026-12-03).
        m_use = jnp.where(m_new == NEG, 0.0, m_new)
        alpha = jnp.exp2(m - m_use)
        p = jnp.exp2(s - m_use[:, None])
        l = l * alpha + jnp.sum(p, axis=1)
        v = load(v_ref)
        acc = acc * alpha[:, None] + plgpu.dot(p.astype(v.dtype), v)
        return acc, m_new, l

    init = (jnp.zeros((block_r, H), jnp.float32), jnp.full((block_r,), NEG, jnp.float32),
            jnp.zeros((block_r,), jnp.float32))
    acc, m, l = lax.fori_loop(0, count, body, init)
    plgpu.store(o_ref, acc, mask=jnp.broadcast_to(row_ok[:, None], (block_r, H)))
    plgpu.store(m_ref, m, mask=row_ok)
    plgpu.store(l_ref, l, mask=row_ok)


def combine(o, m, l):
    """Log-sum-exp combine of the splits: o (B, K, P, R, H), m and l (B, K, P, R) -> (B, K, R, H) float32.

    m is in log2 units; a split that saw no key has m = NEG (finite), l = 0, o = 0 and weighs 0
    (2^(NEG - M) = 0 beside any split that saw a key). A row that saw no key at all (only with
    unchecked lengths under jit) has l = 0 everywhere and gives 0.
    """
    import jax.numpy as jnp

    top = jnp.max(m, axis=2, keepdims=True)
    w = jnp.exp2(m - top)                                   # (B, K, P, R)
    den = jnp.sum(w * l, axis=2)
    num = jnp.sum(w[..., None] * o, axis=2)
    return num / jnp.where(den == 0, 1.0, den)[..., None]


def decode_attention_pallas(q, k, v, lengths, *, causal: bool = True, scale: float | None = None,
                            config: DecodeConfig | None = None, interpret: bool | None = None,
                            plan: Plan | None = None, page_table=None,
                            soft_cap: float | None = None):
    """The kernel on already validated inputs (see ``attnlab.decode_attention`` for the checks).

    q (B, T, N, H); k, v (B, S, K, H), one dtype (float16, bfloat16 or float32); lengths (B,)
    int, traced or not. With ``page_table`` (B, pages_per_seq) int32, k and v are pages
    (P, page_size, K, H) in vLLM's layout (``attnlab.kernels.pages``; page_size a power of two)
    and S = pages_per_seq * page_size. ``scale`` must be a Python float (default 1/sqrt(H)): it
    is compiled in, as is
    ``soft_cap`` (logits -> soft_cap * tanh(logits / soft_cap), None: no cap). ``interpret`` defaults to True when JAX's default backend is not a GPU.
    Returns (B, T, N, H) in q's dtype.
    """
    import jax
    import numpy as np
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    B, T, N, H = (int(d) for d in q.shape)
    if page_table is None:
        _, S, K, _ = (int(d) for d in k.shape)
        page_size = None
    else:
        n_pages, page_size, K, _ = (int(d) for d in k.shape)
        S = int(page_table.shape[1]) * page_size
    G = N // K
    scale = 1.0 / math.sqrt(H) if scale is None else float(scale)
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    if plan is None:
        from .. import device

        cc = device.current().compute_capability
        known = None if isinstance(lengths, jax.core.Tracer) else [int(n) for n in np.asarray(lengths)]
        plan = make_plan(B, T, S, N, K, H, q.dtype, config, compute_capability=cc, lengths=known)
    R, br, P = plan.rows, plan.block_r, plan.num_splits
    qp = q.reshape(B, T, K, G, H)
    qp = (qp.reshape(B, K, R, H) if T == 1 else jnp.transpose(qp, (0, 2, 1, 3, 4)).reshape(B, K, R, H))
    lengths = jnp.asarray(lengths).astype(jnp.int32)

    def bk(x):
        return lax.div(x, K), lax.rem(x, K)

    kernel = functools.partial(_kernel, q_len=T, groups=G, rows=R, kv_len=S, block_r=br, block_k=plan.block_k,
                               num_splits=P, causal=bool(causal) and T > 1, qk_scale=scale * LOG2E,
                               page_size=page_size,
                               soft_cap=None if soft_cap is None else float(soft_cap) * LOG2E)
    if page_table is None:
        kv_spec = pl.BlockSpec((None, S, None, H), lambda r, j, x: (bk(x)[0], 0, bk(x)[1], 0))
        table_specs, tables = [], []
    else:   # one kv head's pages, all of them, as (P * page_size, H) rows; the sequence's row of the table
        k, v = (x.reshape(n_pages * page_size, K, H) for x in (k, v))
        kv_spec = pl.BlockSpec((n_pages * page_size, None, H), lambda r, j, x: (0, bk(x)[1], 0))
        table_specs = [pl.BlockSpec((None, S // page_size), lambda r, j, x: (bk(x)[0], 0))]
        tables = [jnp.asarray(page_table).astype(jnp.int32)]
    o, m, l = pl.pallas_call(
        kernel,
        grid=(plan.row_tiles, P, B * K),
        in_specs=[
            pl.BlockSpec((1,), lambda r, j, x: (bk(x)[0],)),
            *table_specs,
            pl.BlockSpec((None, None, br, H), lambda r, j, x: (*bk(x), r, 0)),
            kv_spec,
            kv_spec,
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, br, H), lambda r, j, x: (*bk(x), j, r, 0)),
            pl.BlockSpec((None, None, None, br), lambda r, j, x: (*bk(x), j, r)),
            pl.BlockSpec((None, None, None, br), lambda r, j, x: (*bk(x), j, r)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((B, K, P, R, H), jnp.float32),
            jax.ShapeDtypeStruct((B, K, P, R), jnp.float32),
            jax.ShapeDtypeStruct((B, K, P, R), jnp.float32),
        ],
        compiler_params=plgpu.CompilerParams(num_warps=plan.num_warps, num_stages=plan.num_stages),
        interpret=interpret,
        name=f"attnlab_decode_r{br}_k{plan.block_k}" + (f"_p{page_size}" if page_size else ""),
    )(lengths, *tables, qp, k, v)
    out = combine(o, m, l).reshape(B, K, T, G, H)
    return jnp.transpose(out, (0, 2, 1, 3, 4)).reshape(B, T, N, H).astype(q.dtype)
