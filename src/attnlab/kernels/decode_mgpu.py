"""attnlab's decode kernel for Hopper in Mosaic GPU (Pallas): wgmma row tiles of 128 rows.

Same semantics, GQA packing and split/combine as ``kernels.decode`` (read its docstring first):
q (B, T, N, H) against caches k, v (B, S, K, H) with valid ``lengths`` (B,); query t of batch b
sits at ``lengths[b] - T + t``; the T*G rows that share a KV head form the rows of one tile
(row r = t * G + g), so every KV byte of a split is read once per 128-row tile.

Why a second kernel: above 64 rows per KV head the Triton kernel is bound by its MMA loop
(``mma.sync`` there, 34-63% of the roofline at 112-512 rows on the H200,
results/gpu-2026-12-04b-decode). This one is FlashAttention-3's structure (JAX's
``jax/experimental/pallas/ops/gpu/attention_mgpu.py``), cut to decode: per program two compute
warpgroups of 64 rows each issue ``wgmma`` on K/V blocks that a third warpgroup streams
into shared memory with TMA (``max_steps`` blocks in flight), with the valid lengths, the
speculative-token causal rule and flash-decoding's splits of ``kernels.decode_plan``.

Grid (row_tiles, num_splits, B*K), row tiles fastest (the last first): the tiles of one KV chunk run together,
so a second tile finds the chunk in L2. Rows past T*G are zero rows of a padded copy of q and
of the partial outputs (at most 127 rows of H per KV head, whole 64-row TMA tiles; K and V are
never copied), dropped after the combine. Blocks wholly visible to every row take the unmasked
loop; the others (a sequence's last blocks) are masked: scores selected, and the value rows of keys
past the length (or before a window) zeroed in shared memory, since a cache's unused slots may hold
NaN (``decode_mgpu_regs.zero_rows_outside``). Outputs are the Triton kernel's
unnormalised partials, (B, K, P, rows, H) float32 and m, l (B, K, P, rows), combined by
``kernels.split_combine.combine``.

Hopper (sm_90) only, float16/bfloat16, H in {64, 128}, S a multiple of ``block_kv``; no soft
cap (the Triton kernel serves it): ``unsupported`` says why. Paged caches: one TMA copy per page.
Sliding windows (``window``): the splits cut only the blocks from the window's first key's block
(``decode_mgpu_plan.program_blocks``); the plan runs it for a window only on request (``pick_kernel``).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ..core.masking import large_negative_value
from .decode_mgpu_plan import (BLOCK_Q, COMPUTE_WGS, MOSAIC_MIN_ROWS, TILE_ROWS, MgpuPlan, make_mgpu_plan,  # noqa: F401
                               pick_kernel, program_blocks, smem_bytes, unsupported)
from .decode_mgpu_regs import gpu_interpreter, register_ops, zero_rows_outside
from .split_combine import combined_queries

LOG2E = math.log2(math.e)
NEG = large_negative_value("float32")


def _kernel(len_ref, table_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, scoped, *, q_len: int, groups: int,
            kv_len: int, kv_heads: int, plan: MgpuPlan, causal: bool, qk_scale: float, dtype, interpret: bool,
            page_size: int | None = None, num_pages: int = 0, window: tuple[int, int] | None = None,
            q_first: bool = False):
    block_kv, max_steps, H = plan.block_kv, plan.max_steps, q_ref.shape[-1]
    (q_smem2, k_smem, v_smem, m_smem2, l_smem2, *o_smem2), (k_bar, v_bar, q_bar), (k_done, v_done), sched = scoped
    # the last row tile first: under the causal rule it reads the most keys (a prefill chunk's tiles: the longest
    # first, so the grid's tail holds the short ones)
    tile = plan.row_tiles - 1 - lax.axis_index("tile")
    split, bk = lax.axis_index("split"), lax.axis_index("bk")
    batch, head = lax.div(bk, kv_heads), lax.rem(bk, kv_heads)
    wg = lax.axis_index("wg")
    # steps [lead, free) are visible to every row (no mask); a window's blocks only (``program_blocks``)
    # the tile's first and last query tokens (row r = t * G + g; rows past T * G are padding)
    tokens = (lax.div(tile * TILE_ROWS, groups),
              lax.div(jnp.minimum(tile * TILE_ROWS + TILE_ROWS - 1, q_len * groups - 1), groups))
    length = jnp.minimum(jnp.maximum(len_ref[0, batch] if q_first else len_ref[batch], 0), kv_len)
    if q_first:   # len_ref (2, B): a tile whose tokens all lie before the sequence's first query token reads no key
        length = jnp.where(tokens[1] < len_ref[1, batch], 0, length)
    first, count, lead, free = program_blocks(length, split, q_len=q_len, block_kv=block_kv, causal=causal,
                                              num_splits=plan.num_splits, window=window, tokens=tokens,
                                              div=lax.div, minimum=jnp.minimum, maximum=jnp.maximum)
    lo = 0 if window is None else jnp.maximum(length - q_len - window[0], 0)     # the first key any row sees

    layout_cast, iota, load = register_ops(interpret)

    def schedule_barrier():
        plgpu.barrier_arrive(sched)
        plgpu.barrier_wait(sched)

    @pl.when(wg < COMPUTE_WGS)
    def _compute():
        plgpu.set_max_registers(232, action="increase")
        q_smem, m_smem, l_smem = q_smem2.at[wg], m_smem2.at[wg], l_smem2.at[wg]
        o_smem = o_smem2[0].at[wg] if plan.stage_out else None
        row0 = tile * TILE_ROWS + wg * BLOCK_Q
        plgpu.copy_gmem_to_smem(q_ref.at[batch, pl.ds(row0, BLOCK_Q), head], q_smem, q_bar.at[wg])
        plgpu.barrier_wait(q_bar.at[wg])
        m = layout_cast(jnp.full((BLOCK_Q,), NEG, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
        l = layout_cast(jnp.full((BLOCK_Q,), 0, jnp.float32), plgpu.Layout.WGMMA.reduce(1))
        acc = layout_cast(jnp.full((BLOCK_Q, H), 0, jnp.float32), plgpu.Layout.WGMMA)

        @pl.when(count > 0)
        def _():
            plgpu.barrier_wait(k_bar.at[0])

        pl.when(wg == 1)(schedule_barrier)

        def step(i, carry, masked: bool):
            acc, m, l = carry
            slot = lax.rem(i, jnp.array(max_steps, i.dtype))

            if interpret:   # JAX's GPU interpreter ignores wgmma's transposed operand: a plain dot
                s = jnp.dot(q_smem[...], k_smem[slot].T, preferred_element_type=jnp.float32)
                schedule_barrier()
            else:
                def qk(acc_ref):
                    plgpu.wgmma(acc_ref, q_smem, k_smem.at[slot].transpose((1, 0)))
                    schedule_barrier()
                    return acc_ref[...]
                s = pl.run_scoped(qk, plgpu.ACC((BLOCK_Q, block_kv), jnp.float32))
            plgpu.barrier_arrive(k_done.at[slot])
            s = s * qk_scale                                    # log2 units
            if masked:
                rows = iota(0, (BLOCK_Q, block_kv)) + row0
                pos = iota(1, (BLOCK_Q, block_kv)) + (first + i) * block_kv
                ok, ahead = pos < length, pos - (length - q_len)     # ahead: pos - p of the row's t = 0
                if causal:   # pos <= length - T + row // G, without a vector division
                    ok = ok & (rows >= ahead * groups)
                if window is not None:   # pos >= p - left, and pos <= p + right without the causal rule
                    ok = ok & (rows < (ahead + window[0] + 1) * groups)
                    if not causal:
                        ok = ok & (rows >= (ahead - window[1]) * groups)
                s = jnp.where(ok, s, NEG)
            m_new = jnp.maximum(m, s.max(axis=1))
            # a row that has seen no key keeps m = NEG: subtract 0 so that 2^(NEG - 0) = 0
            m_use = jnp.where(m_new == NEG, 0.0, m_new) if masked else m_new
            alpha = jnp.exp2(m - m_use)
            p = jnp.exp2(s - lax.broadcast_in_dim(m_use, s.shape, [0]))
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            l = l * alpha + p.sum(axis=1)
            p16 = p.astype(dtype)
            acc, l, m_new, p16 = lax.optimization_barrier((acc, l, m_new, p16))
            plgpu.barrier_arrive(sched)
            plgpu.barrier_wait(v_bar.at[slot])
            if masked:   # the keys past the length (or before the window) in shared memory: 0 * NaN in P.V
                zero_rows_outside(v_smem.at[slot], (first + i) * block_kv, lo, length, iota=iota, load=load)
            plgpu.barrier_wait(sched)

            def wait_next_k():
                nxt = i + 1
                @pl.when(nxt < count)
                def _():
                    plgpu.barrier_wait(k_bar.at[lax.rem(nxt, jnp.array(max_steps, i.dtype))])

            if interpret:   # nor does it run wgmma from registers or run_state
                acc = acc + jnp.dot(p16, v_smem[slot], preferred_element_type=jnp.float32)
                wait_next_k()
            else:
                def pv(acc_ref):
                    plgpu.wgmma(acc_ref, p16, v_smem.at[slot])
                    wait_next_k()
                acc = pl.run_state(pv)(plgpu.ACC.init(acc))
            plgpu.barrier_arrive(v_done.at[slot])
            return acc, m_new, l

        carry = (acc, m, l)
        if window is not None:
            carry = lax.fori_loop(0, lead, functools.partial(step, masked=True), carry)
        carry = lax.fori_loop(lead, free, functools.partial(step, masked=False), carry)
        acc, m, l = lax.fori_loop(free, count, functools.partial(step, masked=True), carry)
        pl.when(wg == 0)(schedule_barrier)
        rows = pl.ds(row0, BLOCK_Q)
        if plan.stage_out:
            o_smem[...] = acc
        else:
            o_ref.at[batch, head, split, rows][...] = acc
        m_smem[...] = m
        l_smem[...] = l
        plgpu.commit_smem()
        if plan.stage_out:
            plgpu.copy_smem_to_gmem(o_smem, o_ref.at[batch, head, split, rows])
        plgpu.copy_smem_to_gmem(m_smem, m_ref.at[batch, head, split, rows])
        plgpu.copy_smem_to_gmem(l_smem, l_ref.at[batch, head, split, rows])
        plgpu.wait_smem_to_gmem(0)

    pieces = max(1, block_kv // page_size) if page_size else 1
    piece = block_kv // pieces

    @pl.when(wg == COMPUTE_WGS)
    def _memory():
        plgpu.set_max_registers(40, action="decrease")

        def sources(i):
            """Where step i's keys are: one (page, rows, head) per page it spans (paged), else one slice.

            Table entries are clamped: past a sequence's length they may be anything (masked keys)."""
            if not page_size:
                return [(batch, pl.ds((first + i) * block_kv, block_kv), head)]
            keys = [(first + i) * block_kv + j * piece for j in range(pieces)]
            pages = [jnp.minimum(jnp.maximum(table_ref[batch, lax.div(key, page_size)], 0), num_pages - 1)
                     for key in keys]
            return [(page, pl.ds(lax.rem(key, page_size), piece), head) for page, key in zip(pages, keys)]

        def copy(ref, buf, bar, srcs, slot):
            # paged: one TMA per page into its rows of the buffer; the barrier expects one arrival each
            for j, src in enumerate(srcs):
                dst = buf.at[slot] if len(srcs) == 1 else buf.at[slot, pl.ds(j * piece, piece)]
                plgpu.copy_gmem_to_smem(ref.at[src], dst, bar.at[slot])

        for i in range(max_steps):
            @pl.when(i < count)
            def _(i=i):
                srcs = sources(i)
                copy(k_ref, k_smem, k_bar, srcs, i)
                copy(v_ref, v_smem, v_bar, srcs, i)

        @pl.loop(0, jnp.maximum(count - max_steps, 0))
        def _(i):
            slot = lax.rem(i, jnp.array(max_steps, i.dtype))
            srcs = sources(i + max_steps)    # the page-table loads fly while the buffers drain
            plgpu.barrier_wait(k_done.at[slot])
            copy(k_ref, k_smem, k_bar, srcs, slot)
            plgpu.barrier_wait(v_done.at[slot])
            copy(v_ref, v_smem, v_bar, srcs, slot)


def decode_attention_mgpu(q, k, v, lengths, *, causal: bool = True, scale: float | None = None,
                          plan: MgpuPlan | None = None, interpret=False, page_table=None, sinks=None, window=None,
                          q_first=None):
    """The Mosaic GPU kernel on already validated inputs: q (B, T, N, H), k, v (B, S, K, H), lengths (B,).
    ``q_first``: None, or (B,) int32: sequence b's query tokens before q_first[b] are padding (a serving step's
    prefill chunk at the end of its slot); a row tile of padding tokens only reads no key and its rows are 0.

    With ``page_table`` (B, pages_per_seq) int32, k and v are pages (P, page_size, K, H) (vLLM's
    layout, page_size a power of two >= 16) and S = pages_per_seq * page_size.
    ``sinks``: None or (N,) float logits (attention sinks), added by the combine (``kernels.split_combine.combine``).
    ``window``: None or (left, right) ints, jax.nn's sliding window around each query's absolute position
    (``kernels.decode``'s rule): the splits cut only the blocks from the window's first key's block on
    (``program_blocks``); that block's keys before the window are loaded and masked, the blocks before it never.
    Returns (B, T, N, H) in q's dtype. ``scale`` is a Python float (default 1/sqrt(H)).
    ``interpret``: True (or ``gpu_interpreter()``) runs it in JAX's GPU interpreter on the CPU,
    where both matmuls are plain dots; everything else (TMA, barriers, splits, masks) is the kernel's.
    """
    if interpret is True:
        interpret = gpu_interpreter()
    B, T, N, H = (int(d) for d in q.shape)
    if page_table is None:
        _, S, K, _ = (int(d) for d in k.shape)
        page_size = num_pages = None
    else:
        num_pages, page_size, K, _ = (int(d) for d in k.shape)
        S = int(page_table.shape[1]) * page_size
    G = N // K
    if window is not None:   # a window past the cache is the cache: keeps the kernel's int32 sums small
        window = tuple(min(int(w), S + T) for w in window)
    plan = plan or make_mgpu_plan(B, T, S, N, K, H, window=window)
    R, P, rows_padded = plan.rows, plan.num_splits, plan.row_tiles * TILE_ROWS
    scale = 1.0 / math.sqrt(H) if scale is None else float(scale)
    qp = jnp.transpose(q.reshape(B, T, K, G, H), (0, 1, 3, 2, 4)).reshape(B, R, K, H)
    qp = jnp.pad(qp, ((0, 0), (0, rows_padded - R), (0, 0), (0, 0)))
    dtype = q.dtype
    tiled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def entry(len_ref, *refs):
        table_ref, (q_ref, k_ref, v_ref, o_ref, m_ref, l_ref) = (refs[0], refs[1:]) if page_size else (None, refs)
        scratch = [
            plgpu.SMEM((COMPUTE_WGS, BLOCK_Q, H), dtype, transforms=tiled),
            plgpu.SMEM((plan.max_steps, plan.block_kv, H), dtype, transforms=tiled),
            plgpu.SMEM((plan.max_steps, plan.block_kv, H), dtype, transforms=tiled),
            plgpu.SMEM((COMPUTE_WGS, BLOCK_Q), jnp.float32),
            plgpu.SMEM((COMPUTE_WGS, BLOCK_Q), jnp.float32),
        ]
        if plan.stage_out:
            scratch.append(plgpu.SMEM((COMPUTE_WGS, BLOCK_Q, H), jnp.float32,
                                      transforms=(plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))))
        body = functools.partial(_kernel, len_ref, table_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, q_len=T,
                                 groups=G, kv_len=S, kv_heads=K, plan=plan, causal=bool(causal) and T > 1,
                                 qk_scale=scale * LOG2E, dtype=dtype, interpret=bool(interpret),
                                 page_size=page_size, num_pages=num_pages or 0, window=window,
                                 q_first=q_first is not None)
        copies = max(1, plan.block_kv // page_size) if page_size else 1
        pl.run_scoped(
            lambda *a: body(a),
            scratch,
            (plgpu.Barrier(num_arrivals=copies, num_barriers=plan.max_steps),
             plgpu.Barrier(num_arrivals=copies, num_barriers=plan.max_steps),
             plgpu.Barrier(num_barriers=COMPUTE_WGS)),
            (plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=plan.max_steps),) * 2,
            plgpu.Barrier(num_arrivals=COMPUTE_WGS),
            collective_axes="wg",
        )

    o, m, l = plgpu.kernel(
        entry,
        out_type=[jax.ShapeDtypeStruct((B, K, P, rows_padded, H), jnp.float32),
                  jax.ShapeDtypeStruct((B, K, P, rows_padded), jnp.float32),
                  jax.ShapeDtypeStruct((B, K, P, rows_padded), jnp.float32)],
        grid=(plan.row_tiles, P, B * K),
        grid_names=("tile", "split", "bk"),
        num_threads=COMPUTE_WGS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=interpret,
    )(jnp.asarray(lengths).astype(jnp.int32) if q_first is None else
      jnp.stack([jnp.asarray(lengths).astype(jnp.int32), jnp.asarray(q_first).astype(jnp.int32)]),
      *([] if page_table is None else [jnp.asarray(page_table, jnp.int32)]),
      qp, k, v)
    return combined_queries(o, m, l, q_len=T, groups=G, dtype=dtype, sinks=sinks)
