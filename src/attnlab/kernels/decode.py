"""attnlab's decode attention kernel in Pallas (Triton lowering): T = 1..64 new tokens against a KV cache.

Semantics (the append / verification rule of FlashInfer and vLLM)
    q (B, T, N, H); k, v caches (B, S, K, H) with S = S_max; ``lengths`` (B,) int, the valid length of each cache
    *including* the T new tokens (T <= lengths[b] <= S). Query t of batch b sits at position
    ``lengths[b] - T + t``. With ``causal`` it attends the keys at positions ``<= lengths[b] - T + t``; without,
    every valid key ``< lengths[b]``. Keys at positions ``>= lengths[b]`` are never read and never attended. No
    row is empty (query t always sees key 0). Output (B, T, N, H) in q's dtype.
    Sliding window ``window`` = (left, right): query t at p = lengths[b] - T + t also needs p - left <= s (and
    s <= p + right when not causal; causal already bounds it by p). The blocks start at ``window_start`` =
    max(0, lengths[b] - T - left), the first key any row sees (at its block's start when a block is one page:
    ``window_base``), and the splits cut only the blocks from there: the keys before the window are never loaded.

Layout and grid
    GQA packing: the T*G query rows that share one KV head (G = N // K) form one tile's rows, row r = t * G + g
    (q is re-laid out as (B, K, T*G, H): a free reshape at T = 1, a small transpose of q otherwise). So every KV
    byte is read once per row tile, and a row tile has ``block_r`` rows (a power of two >= 16, the MMA minimum;
    rows past T*G are masked). grid = (row_tiles, num_splits, B*K), axis 0 fastest: the row tiles of one KV
    chunk are launched together, so when T*G > block_r the second tile finds the chunk in L2.
    Flash-decoding: program (r, j, b*K + h) reads split j of batch b's *valid* keys, ``split_range(lengths[b],
    j)``: the valid blocks ceil(lengths[b] / block_k) are cut into ``num_splits`` equal runs of whole blocks, so a
    short sequence's programs loop fewer times (a ragged batch reads what it holds, rounded up to block_k per
    sequence; programs past the end do no loads). Inside a program an online softmax (exp2, float32 scores,
    running max and sum) streams block_k keys at a time: S = q k^T (bf16/fp16 MMA, float32 accumulation),
    P = exp2(S - m) rounded to the input dtype, O += P v (float32 accumulation); the blocks every row sees
    whole first, unmasked, with ``DecodeConfig.whole_blocks``, then the rest masked.
    Each program writes its unnormalised partial O (float32), running max m and sum l; a second step in jax.numpy
    (fused by XLA) combines the splits by log-sum-exp (one split: ``decode_direct``, the program normalises and
    stores O in q's dtype itself, no second step): O = sum_j 2^(m_j - M) O_j / sum_j 2^(m_j - M) l_j with
    M = max_j m_j (with ``sinks``, gpt-oss's attention sinks, M also takes the row's sink and the denominator
    gains 2^(sink - M), once per row).

What is read from HBM
    KV: ceil(lengths[b] / block_k) * block_k rows of (H,) per (b, kv head), K and V once each (the masked tail
    of the last block is not fetched; with a window only the blocks from the window's first one); q once per
    split; partials (B, K, splits, T*G, H+2) float32 written then read by the combine (weighed by the split
    rule; ~1% at T*G = 16, at most 25%; none at one split).

Why Triton here, and Mosaic GPU above 64 rows
    Up to T*G ~ 200 rows the work is bandwidth-bound (arithmetic intensity T*N/K FLOP/byte, ridge ~206 on the
    H200); what it needs is masked loads against per-batch valid lengths, a dynamic trip count and deep software
    pipelining (``num_stages``), which Triton gives on Ampere and Hopper alike, in Pallas interpret mode on the CPU
    for the tests. Compiled for sm_90 by Triton 3.6 (``benchmarks/decode/ttir_cpu.py``) the default tiles use
    mma.sync at 16-32 rows and wgmma from 64, cp.async pipelines for K and V, no register spills. Above 64 rows per
    KV head its MMA loop bounds it (59-63% of the roofline at 112-128 rows on the H200), so on sm_90 the plan runs
    ``kernels.decode_mgpu`` there instead (warp-specialised wgmma + TMA: 84-89%); see
    ``decode_mgpu_plan.pick_kernel``. JAX 0.11 marks the Pallas Triton backend deprecated (a DeprecationWarning
    at lowering); it still ships and works there.

Paged caches (``page_table``): ``paged_load.load_kv_block`` reads each block through the table.
Quantized caches (FP8/int8 with ``k_scale``/``v_scale``): read at 1 byte per element, dequantized in registers
(``kernels.kv_dequant``), the products in float16 for FP8 and a bfloat16 q (``Plan.kv_mma``); Triton only.
Tuning parameters and the split count: ``kernels.decode_plan``; the GPU's SM count, shared memory and occupancy:
``kernels.decode_resources``. Both are re-exported here.
"""
from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from ..core import device
from ..core.masking import large_negative_value
from . import decode_direct as direct_out
from . import decode_mgpu
from .decode_plan import (DTYPES, HEAD_DIMS, MAX_ROWS, MIN_ROWS, DecodeConfig, Plan,  # noqa: F401
                          blocks_visited, compiled_stages, default_block_k, make_plan, next_pow2, unsupported,
                          window_base, window_start)
from .decode_resources import (CPU_SM_COUNT, DEFAULT_SM_COUNT, REGS_PER_SM, SM_COUNTS, SMEM_PER_BLOCK,  # noqa: F401
                               SMEM_PER_BLOCK_OTHER_SM8X, SMEM_PER_SM, SMEM_SLACK, fit_stages, programs_per_sm,
                               sm_count, smem_bytes, smem_limit)
from .decode_splits import FILL_BLOCKS, cdiv, choose_num_splits, split_range, wave_cost  # noqa: F401
from .kv_dequant import (load_scale_block, pair_view, paired_v_scale, pv_top, quantized_pv, quantized_query,
                         quantized_scores, scale_block_spec, scale_inputs)
from .paged_load import load_kv_block
from .split_combine import combine, combined_queries, sink_rows  # noqa: F401  (re-exported)

LOG2E = math.log2(math.e)
#: Masked scores and the running max of a row that has seen no key: jax.nn's finite large negative
#: (``attnlab.core.masking``), never -inf, so the kernel's outputs (partial m) hold no Inf.
NEG = large_negative_value("float32")


def cuda_lowering_context(device_kind: str = "NVIDIA H200", cores: int = 132):
    """A context in which ``jit(...).trace(...).lower(lowering_platforms=("cuda",))`` works without a GPU.

    JAX <= 0.10 lowers Pallas Triton kernels for sm_90 when no GPU is present; JAX >= 0.11 asks
    for an abstract GPU device, given here through an abstract mesh (JAX-private API, so a
    no-op context where it is missing). For checking the lowering on a CPU only.
    """
    try:
        from jax._src.mesh import AbstractDevice  # JAX-private: may move

        mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(device_kind, cores, "gpu"))
        return jax.sharding.use_abstract_mesh(mesh)
    except (ImportError, TypeError, AttributeError):
        return contextlib.nullcontext()


def _kernel(len_ref, *refs, q_len: int, groups: int, rows: int, kv_len: int, block_r: int, block_k: int,
            num_splits: int, causal: bool, qk_scale: float, page_size: int | None = None,
            soft_cap: float | None = None, window: tuple[int, int] | None = None, kv_scale: str | None = None,
            kv_mma: str | None = None, direct: bool = False, sinks: bool = False, kv_pairs=None, whole_blocks=False,
            interpret=False):
    # paged: refs start with this sequence's page table row, and k_ref / v_ref are (P * page_size, H);
    # a quantized cache (kv_scale: its scale layout) adds the two scale refs after v_ref. ``direct`` (one split,
    # ``decode_direct``): q_ref and the one output are (T, G, H) blocks, after the (G,) sinks when ``sinks``
    table_ref, refs = (refs[0], refs[1:]) if page_size else (None, refs)
    (q_ref, k_ref, v_ref), refs = refs[:3], refs[3:]
    (ks_ref, vs_ref), refs = (refs[:2], refs[2:]) if kv_scale else ((None, None), refs)
    sinks_ref, refs = (refs[0], refs[1:]) if sinks else (None, refs)
    H = q_ref.shape[-1]
    tile, split = pl.program_id(0), pl.program_id(1)
    # Lengths are clamped to [0, S]: under jit they are not checked, and nothing past S is ever read.
    length = jnp.minimum(jnp.maximum(len_ref[0], 0), kv_len)
    row = tile * block_r + lax.iota(jnp.int32, block_r)
    row_ok = row < rows
    q = (direct_out.load_q(q_ref, row, row_ok, groups=groups) if direct
         else plgpu.load(q_ref, mask=jnp.broadcast_to(row_ok[:, None], (block_r, H)), other=0))
    # kv_pairs: the FP8 dtype of a ``pair_view`` cache (q as its even and odd columns), or None
    q_mma, row_factor = quantized_query(q, kv_mma, kv_pairs) if kv_scale else (q, None)
    base, aligned = window_base(window_start(length, q_len, window, maximum=jnp.maximum), block_k, page_size,
                                div=lax.div)
    first, count = split_range(length - base, split, num_splits=num_splits, block_k=block_k,
                               div=lax.div, minimum=jnp.minimum, maximum=jnp.maximum)
    q_pos = length - q_len + lax.div(row, groups)          # position of each row's query
    cols = lax.iota(jnp.int32, block_k)
    block_scales = functools.partial(load_scale_block, layout=kv_scale, block_k=block_k, page_size=page_size,
                                     table_ref=table_ref)
    at0 = jnp.where(count > 0, base + first * block_k, 0)        # the first block, in the table even when empty
    top = pv_top(vs_ref, kv_scale, lambda: block_scales(vs_ref, start=at0, kv_ok=at0 + cols < length), kv_pairs)

    def body(i, carry, masked=True):
        acc, m, l = carry
        start = base + (first + i) * block_k
        if aligned:
            start = pl.multiple_of(start, block_k)
        pos = start + cols
        kv_ok = pos < length if masked else jnp.ones((block_k,), jnp.bool_)
        load = functools.partial(load_kv_block, start=start, kv_ok=kv_ok, length=length, block_k=block_k,
                                 page_size=page_size, table_ref=table_ref)
        k = load(k_ref)
        if kv_scale:   # dequantized in registers (``dequantized_scores``)
            scales = functools.partial(block_scales, start=start, kv_ok=kv_ok)
            s = quantized_scores(q_mma, k, scales(ks_ref), row_factor, qk_scale, kv_pairs, interpret)
        else:
            s = plgpu.dot(q, k, trans_b=True) * qk_scale    # (block_r, block_k) float32, log2 units
        if soft_cap is not None:                             # cap * tanh(x / cap), cap in log2 units too
            s = soft_cap * jnp.tanh(s / soft_cap)
        if masked:     # finite, as jax.nn (attnlab.core.masking)
            visible = kv_ok[None, :]
            if causal:
                visible = visible & (pos[None, :] <= q_pos[:, None])
            if window is not None:
                visible = visible & (pos[None, :] >= q_pos[:, None] - window[0])
                if not causal:
                    visible = visible & (pos[None, :] <= q_pos[:, None] + window[1])
            s = jnp.where(visible, s, NEG)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))           # NEG for rows that have seen no key yet
        # Such rows subtract 0 instead, so 2^(NEG - 0) = 0 keeps their l = 0 and acc = 0. A per-row
        # select: a second per-element select on p cost 7-55% at T = 16-64 on the H200 (2026-12-03).
        m_use = jnp.where(m_new == NEG, 0.0, m_new) if masked else m_new
        alpha = jnp.exp2(m - m_use)
        p = jnp.exp2(s - m_use[:, None])
        l = l * alpha + jnp.sum(p, axis=1)
        v = load(v_ref)
        pv = (quantized_pv(p, v, scales(vs_ref), q_mma, kv_pairs, interpret, top) if kv_scale
              else plgpu.dot(p.astype(v.dtype), v))
        acc = acc * alpha[:, None] + pv
        return acc, m_new, l

    init = (jnp.zeros((block_r, H), jnp.float32), jnp.full((block_r,), NEG, jnp.float32),
            jnp.zeros((block_r,), jnp.float32))
    whole = 0   # the blocks every row sees whole first, without the mask's compares and selects (no window)
    if whole_blocks and window is None:
        whole = jnp.clip(lax.div(length - (q_len - 1 if causal else 0) - base, block_k) - first, 0, count)
        init = lax.fori_loop(0, whole, functools.partial(body, masked=False), init)
    acc, m, l = lax.fori_loop(whole, count, body, init)
    acc = paired_v_scale(acc, top)   # the scale ``paired_pv`` left
    if direct:
        sink = None if sinks_ref is None else direct_out.load_sinks(sinks_ref, row, row_ok, groups=groups)
        return direct_out.store_normalised(refs[0], acc, m, l, row, row_ok, groups=groups, sink=sink)
    o_ref, m_ref, l_ref = refs
    plgpu.store(o_ref, acc, mask=jnp.broadcast_to(row_ok[:, None], (block_r, H)))
    plgpu.store(m_ref, m, mask=row_ok)
    plgpu.store(l_ref, l, mask=row_ok)


def decode_attention_pallas(q, k, v, lengths, *, causal: bool = True, scale: float | None = None,
                            config: DecodeConfig | None = None, interpret: bool | None = None,
                            plan: Plan | None = None, page_table=None,
                            soft_cap: float | None = None, window: tuple[int, int] | None = None, sinks=None,
                            k_scale=None, v_scale=None, kv_scale: str | None = None):
    """The kernel on already validated inputs (see ``attnlab.decode_attention`` for the checks).

    q (B, T, N, H); k, v (B, S, K, H), one dtype (float16, bfloat16 or float32); lengths (B,)
    int, traced or not. With ``page_table`` (B, pages_per_seq) int32, k and v are pages
    (P, page_size, K, H) in vLLM's layout (``attnlab.kernels.pages``; page_size a power of two)
    and S = pages_per_seq * page_size. ``scale`` must be a Python float (default 1/sqrt(H)): it is compiled in,
    as is ``soft_cap`` (logits -> soft_cap * tanh(logits / soft_cap), None: no cap), and ``window``
    ((left, right) ints: the sliding window, None: none; a windowed call runs this Triton kernel unless
    ``config.kernel`` is "mosaic", ``decode_mgpu_plan.pick_kernel``). ``interpret`` defaults to True when JAX's
    default backend is not a GPU.
    ``sinks``: None or (N,) float logits (traced or not), gpt-oss's attention sinks: one more logit per
    query head in the softmax denominator, with no value, added by the combine (``combine``; one split: in the
    kernel, ``decode_direct``).
    A quantized cache (k, v FP8 or int8): ``k_scale``/``v_scale`` float32 in the layout ``kv_scale``
    (``attnlab.core.kv_quant``), dequantized in registers (``kernels.kv_dequant``): the Triton kernel always.
    Returns (B, T, N, H) in q's dtype.
    """
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
        cc = device.current().compute_capability
        requested = None if config is None else config.requested_kernel()
        # T*G > 64 rows on Hopper, or a window with kernel="mosaic": the wgmma kernel (decode_mgpu_plan.pick_kernel)
        if decode_mgpu.pick_kernel(T, S, N, K, H, str(q.dtype), compute_capability=None if interpret else cc,
                                   page_size=page_size, soft_cap=soft_cap, window=window,
                                   requested=requested, quantized=bool(kv_scale)) == "mosaic":
            return decode_mgpu.decode_attention_mgpu(q, k, v, lengths, causal=causal, scale=scale,
                                                     interpret=decode_mgpu.gpu_interpreter() if interpret else False,
                                                     page_table=page_table, sinks=sinks, window=window)
        known = None if isinstance(lengths, jax.core.Tracer) else [int(n) for n in np.asarray(lengths)]
        plan = make_plan(B, T, S, N, K, H, q.dtype, config, compute_capability=cc, lengths=known, window=window,
                         kv_dtype=str(k.dtype) if kv_scale else None)
    R, br, P, direct = plan.rows, plan.block_r, plan.num_splits, plan.direct
    lengths = jnp.asarray(lengths).astype(jnp.int32)

    def bk(x):
        return lax.div(x, K), lax.rem(x, K)

    if direct:     # one split: no partials, no combine (``decode_direct``)
        qp, *sink_in = direct_out.packed_inputs(q, sinks, K)
        (q_spec, *sink_specs), out_specs = direct_out.block_specs(T, G, H, bk, sinks is not None)
        out_shape = direct_out.out_struct(q, K)
    else:
        qp = q.reshape(B, T, K, G, H)
        qp = (qp.reshape(B, K, R, H) if T == 1 else jnp.transpose(qp, (0, 2, 1, 3, 4)).reshape(B, K, R, H))
        q_spec, sink_specs, sink_in = pl.BlockSpec((None, None, br, H), lambda r, j, x: (*bk(x), r, 0)), [], []
        out_specs = [pl.BlockSpec((None, None, None, br, H), lambda r, j, x: (*bk(x), j, r, 0)),
                     *[pl.BlockSpec((None, None, None, br), lambda r, j, x: (*bk(x), j, r))] * 2]
        out_shape = [jax.ShapeDtypeStruct((B, K, P, R, H), jnp.float32),
                     *[jax.ShapeDtypeStruct((B, K, P, R), jnp.float32)] * 2]
    kernel = functools.partial(_kernel, q_len=T, groups=G, rows=R, kv_len=S, block_r=br, block_k=plan.block_k,
                               num_splits=P, causal=bool(causal) and T > 1, qk_scale=scale * LOG2E,
                               page_size=page_size, kv_scale=kv_scale, kv_mma=plan.kv_mma, direct=direct,
                               sinks=direct and sinks is not None, interpret=interpret,
                               kv_pairs=str(k.dtype) if plan.kv_pairs and kv_scale else None,
                               whole_blocks=plan.whole_blocks,
                               soft_cap=None if soft_cap is None else float(soft_cap) * LOG2E,
                               window=None if window is None else (int(window[0]), int(window[1])))
    k, v = (pair_view(k), pair_view(v)) if plan.kv_pairs and kv_scale else (k, v)   # (..., H / 2) int16
    if page_table is None:
        kv_spec = pl.BlockSpec((None, S, None, k.shape[-1]), lambda r, j, x: (bk(x)[0], 0, bk(x)[1], 0))
        table_specs, tables = [], []
    else:   # one kv head's pages, all of them, as (P * page_size, H) rows; the sequence's row of the table
        k, v = (x.reshape(n_pages * page_size, K, x.shape[-1]) for x in (k, v))
        kv_spec = pl.BlockSpec((n_pages * page_size, None, k.shape[-1]), lambda r, j, x: (0, bk(x)[1], 0))
        table_specs = [pl.BlockSpec((None, S // page_size), lambda r, j, x: (bk(x)[0], 0))]
        tables = [jnp.asarray(page_table).astype(jnp.int32)]
    scales = scale_inputs(k_scale, v_scale, kv_scale, K=K)
    scale_spec = [scale_block_spec(kv_scale, scales[0].shape, lambda r, j, x: bk(x),
                                   rows=None if page_table is not None else S)] * 2 if scales else []
    out = pl.pallas_call(
        kernel,
        grid=(plan.row_tiles, P, B * K),
        in_specs=[pl.BlockSpec((1,), lambda r, j, x: (bk(x)[0],)), *table_specs, q_spec, kv_spec, kv_spec,
                  *scale_spec, *sink_specs],
        out_specs=out_specs,
        out_shape=out_shape,
        # paged: the K/V addresses come from a table load (one indirection level), which halves
        # Triton's prefetch distance unless num_stages is raised (``compiled_stages``)
        compiler_params=plgpu.CompilerParams(
            num_warps=plan.num_warps, num_stages=compiled_stages(plan.num_stages, 0 if page_table is None else 1)),
        interpret=interpret,
        name=f"attnlab_decode_r{br}_k{plan.block_k}" + (f"_p{page_size}" if page_size else "")
        + ("_direct" if direct else ""),
    )(lengths, *tables, qp, k, v, *scales, *sink_in)
    if direct:
        return out.reshape(B, T, N, H)
    return combined_queries(*out, q_len=T, groups=G, dtype=q.dtype, sinks=sinks)
