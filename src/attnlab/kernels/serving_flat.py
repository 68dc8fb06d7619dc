"""The decode class's programs as one loop over their blocks, across pieces (``ServingConfig(flat=True)``;
opt-in, unmeasured).

In ``serving.run_pieces`` each piece is its own loop, so the K/V pipeline starts again at every piece: a
few blocks' latency each time, which weighs where a program's run holds several short requests (the
skewed batches: ~30 blocks a program, 2-3 pieces). Here program p walks blocks runs[p] .. runs[p+1]-1 of
the class's sequence in one loop; block g's K/V row and piece come from the plan's table (``blocks``,
one level of indirection, as a page table: Triton still prefetches the loads). At a piece's first block
the query tile is loaded and the running max reset (which zeroes O and l); at its last the partial is stored (both
predicated, no branch).
"""
from __future__ import annotations

import functools

from .decode import NEG
from .serving import NF, _row_index


def run_flat(p, h, runs_ref, blocks_ref, pieces_ref, table_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, *,
             groups: int, heads: int, kv_len: int, block_r: int, block_k: int, qk_scale: float,
             page_size: int | None, soft_cap: float | None, split_mask: bool):
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    from .paged_load import load_kv_block

    del split_mask
    H = q_ref.shape[-1]
    row = lax.iota(jnp.int32, block_r)
    dims = lax.iota(jnp.int32, H)
    cols = lax.iota(jnp.int32, block_k)

    def body(g, c):
        acc, m, l, q = c
        kv_row, j, flags = blocks_ref[3 * g], blocks_ref[3 * g + 1], blocks_ref[3 * g + 2]
        b, q_start, row_off, n_rows, q_pos0, length, _, _ = (pieces_ref[j * NF + f] for f in range(NF))
        new, last = lax.rem(flags, 2) == 1, flags >= 2
        row_ok = row < n_rows
        idx = jnp.where(row_ok, _row_index(q_start, row_off, row, h, groups, heads), 0)
        fresh = plgpu.load(q_ref.at[idx[:, None], dims[None, :]],
                           mask=jnp.broadcast_to((row_ok & new)[:, None], (block_r, H)), other=0)
        q = jnp.where(new, fresh, q)
        m = jnp.where(new, NEG, m)          # a new piece: alpha = 2^(NEG - m) = 0 clears acc and l below
        pos = kv_row - b * kv_len + cols           # the block's first key: its row less the request's base
        kv_ok = pos < length
        load = functools.partial(load_kv_block, start=kv_row, kv_ok=kv_ok, length=length, block_k=block_k,
                                 page_size=page_size, table_ref=table_ref)
        s = plgpu.dot(q, load(k_ref), trans_b=True) * qk_scale
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        q_pos = q_pos0 + lax.div(row_off + row, groups)
        s = jnp.where(kv_ok[None, :] & (pos[None, :] <= q_pos[:, None]), s, NEG)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        m_use = jnp.where(m_new == NEG, 0.0, m_new)
        alpha = jnp.exp2(m - m_use)
        pr = jnp.exp2(s - m_use[:, None])
        l = l * alpha + jnp.sum(pr, axis=1)
        v = load(v_ref)
        acc = acc * alpha[:, None] + plgpu.dot(pr.astype(v.dtype), v)
        slot = j * block_r
        plgpu.store(o_ref.at[pl.ds(slot, block_r), :], acc, mask=jnp.broadcast_to(last, (block_r, H)))
        plgpu.store(m_ref.at[pl.ds(slot, block_r)], m_new, mask=jnp.broadcast_to(last, (block_r,)))
        plgpu.store(l_ref.at[pl.ds(slot, block_r)], l, mask=jnp.broadcast_to(last, (block_r,)))
        return acc, m_new, l, q

    init = (jnp.zeros((block_r, H), jnp.float32), jnp.full((block_r,), NEG, jnp.float32),
            jnp.zeros((block_r,), jnp.float32), jnp.zeros((block_r, H), q_ref.dtype))
    lax.fori_loop(runs_ref[p], runs_ref[p + 1], body, init)


def _flat_kernel(runs_ref, blocks_ref, pieces_ref, *refs, **static):
    from jax.experimental import pallas as pl

    table_ref, (q_ref, k_ref, v_ref, o_ref, m_ref, l_ref) = (refs[0], refs[1:]) if static["page_size"] else (None, refs)
    run_flat(pl.program_id(0), pl.program_id(1), runs_ref, blocks_ref, pieces_ref, table_ref, q_ref, k_ref, v_ref,
             o_ref, m_ref, l_ref, **static)


def flat_pieces_call(cp, q_flat, k, v, table, *, K: int, H: int, static: dict, interpret: bool):
    """The decode class's kernel in the flat form: grid (programs, K); returns its partials."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    from .decode_plan import compiled_stages
    from .serving import kernel_name, partial_shapes

    n_pieces, n_blocks = int(cp.pieces.shape[0]), int(cp.blocks.shape[0])
    full = lambda shape: pl.BlockSpec(shape, lambda p, h: (0,) * len(shape))   # noqa: E731
    kv_spec = pl.BlockSpec((int(k.shape[0]), None, H), lambda p, h: (0, h, 0))
    tables = [] if table is None else [table]
    slots = n_pieces * cp.block_r
    return pl.pallas_call(
        functools.partial(_flat_kernel, **static),
        grid=(cp.programs, K),
        in_specs=[full((cp.programs + 1,)), full((n_blocks * 3,)), full((n_pieces * NF,)),
                  *[full(tuple(t.shape)) for t in tables], full(tuple(q_flat.shape)), kv_spec, kv_spec],
        out_specs=[pl.BlockSpec((None, slots, H), lambda p, h: (h, 0, 0)), pl.BlockSpec((None, slots), lambda p, h: (h, 0)),
                   pl.BlockSpec((None, slots), lambda p, h: (h, 0))],
        out_shape=partial_shapes(cp, K, H),
        # the K/V rows come from the block table (one level), the page table adds one
        compiler_params=plgpu.CompilerParams(
            num_warps=cp.num_warps, num_stages=compiled_stages(cp.num_stages, 1 if table is None else 2)),
        interpret=interpret,
        name=kernel_name(cp, static["page_size"]).replace("_decode_", "_decode_flat_"),
    )(cp.starts, cp.blocks.reshape(-1), cp.pieces.reshape(-1), *tables, q_flat, k, v)
