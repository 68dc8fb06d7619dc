"""attnlab's serving kernel in Pallas (Triton lowering): ragged requests, mixed prefill and decode, one plan.

Semantics: ``attnlab.serving_attention`` (q (T_total, N, H) packed token by token, q_starts (B+1,),
kv_lengths (B,) counting the new tokens; query i of request b at position kv_len - q_len + i sees the
keys at positions <= its own; padding tokens give 0).

Layout and grid
    q is re-laid out as (K, T_total * G, H): row t*G + g of KV head h is token t's query head
    h*G + g (GQA packing, as ``kernels.decode``), so a request's rows for one KV head are contiguous.
    The plan (``kernels.serving_plan``) gives each tile class a list of pieces and each program a run
    of them; grid = (programs, K). Program (p, h) walks its pieces: for each, an online softmax (exp2,
    float32 scores, running max and sum) streams the piece's KV blocks of its request (causal mask by
    position, keys past kv_len never loaded) and writes the unnormalised partial O (float32), m and l
    to the piece's slot. Every program of a class does the same number of KV blocks (stream-K).
    K/V are read from the cache of request b as rows b*S + pos (contiguous (B*S, K, H)) or through the
    page table (paged: the flattened table seen as one long sequence, ``paged_load.load_kv_block``).
Merge (jax.numpy, fused by XLA)
    Each piece row's target is (token, query head); per target M = max m, O = sum 2^(m - M) O_i /
    sum 2^(m - M) l_i, scattered straight into (T_total, N, H) (rows of no piece, the padding tokens,
    stay 0).
"""
from __future__ import annotations

import functools
import math

from .decode import LOG2E, NEG
from .decode_plan import compiled_stages
from .serving_plan import FIELDS, ServingPlan

NF = len(FIELDS)


def _kernel(starts_ref, pieces_ref, *refs, groups: int, kv_len: int, block_r: int, block_k: int, qk_scale: float,
            page_size: int | None, soft_cap: float | None):
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    from .paged_load import load_kv_block

    table_ref, (q_ref, k_ref, v_ref, o_ref, m_ref, l_ref) = (refs[0], refs[1:]) if page_size else (None, refs)
    H = q_ref.shape[-1]
    p = pl.program_id(0)
    row = lax.iota(jnp.int32, block_r)
    cols = lax.iota(jnp.int32, block_k)
    aligned = kv_len % block_k == 0

    def piece(j, carry):
        b, q_row, row_off, n_rows, q_pos0, length, first, count = (pieces_ref[j * NF + f] for f in range(NF))
        row_ok = row < n_rows
        rmask = jnp.broadcast_to(row_ok[:, None], (block_r, H))
        q = plgpu.load(q_ref.at[pl.ds(q_row, block_r), :], mask=rmask, other=0)
        q_pos = q_pos0 + lax.div(row_off + row, groups)
        base = b * kv_len

        def body(i, c):
            acc, m, l = c
            start = (first + i) * block_k
            pos = start + cols
            kv_ok = pos < length
            at = base + start
            load = functools.partial(load_kv_block, start=pl.multiple_of(at, block_k) if aligned else at,
                                     kv_ok=kv_ok, length=length, block_k=block_k, page_size=page_size,
                                     table_ref=table_ref)
            s = plgpu.dot(q, load(k_ref), trans_b=True) * qk_scale
            if soft_cap is not None:
                s = soft_cap * jnp.tanh(s / soft_cap)
            s = jnp.where(kv_ok[None, :] & (pos[None, :] <= q_pos[:, None]), s, NEG)
            m_new = jnp.maximum(m, jnp.max(s, axis=1))
            m_use = jnp.where(m_new == NEG, 0.0, m_new)
            alpha = jnp.exp2(m - m_use)
            pr = jnp.exp2(s - m_use[:, None])
            l = l * alpha + jnp.sum(pr, axis=1)
            v = load(v_ref)
            acc = acc * alpha[:, None] + plgpu.dot(pr.astype(v.dtype), v)
            return acc, m_new, l

        init = (jnp.zeros((block_r, H), jnp.float32), jnp.full((block_r,), NEG, jnp.float32),
                jnp.zeros((block_r,), jnp.float32))
        acc, m, l = lax.fori_loop(0, count, body, init)
        slot = j * block_r
        plgpu.store(o_ref.at[pl.ds(slot, block_r), :], acc)
        plgpu.store(m_ref.at[pl.ds(slot, block_r)], m)
        plgpu.store(l_ref.at[pl.ds(slot, block_r)], l)
        return carry

    lax.fori_loop(starts_ref[p], starts_ref[p + 1], piece, 0)


def _run_class(cp, qp, k, v, table, *, K, G, S, H, block_k, qk_scale, page_size, soft_cap, interpret, dtype_name):
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    br = cp.block_r
    n_pieces = int(cp.pieces.shape[0])
    rows_q = int(qp.shape[1])
    qp = jnp.pad(qp, ((0, 0), (0, br), (0, 0)))     # a tile's load never runs past the array
    kernel = functools.partial(_kernel, groups=G, kv_len=S, block_r=br, block_k=block_k, qk_scale=qk_scale,
                               page_size=page_size, soft_cap=soft_cap)
    full = lambda shape: pl.BlockSpec(shape, lambda p, h: (0,) * len(shape))   # noqa: E731
    kv_rows = int(k.shape[0])
    kv_spec = pl.BlockSpec((kv_rows, None, H), lambda p, h: (0, h, 0))
    tables = [] if table is None else [table]
    o, m, l = pl.pallas_call(
        kernel,
        grid=(cp.programs, K),
        in_specs=[full((cp.programs + 1,)), full((n_pieces * NF,)),
                  *[full(tuple(t.shape)) for t in tables],
                  pl.BlockSpec((None, rows_q + br, H), lambda p, h: (h, 0, 0)), kv_spec, kv_spec],
        out_specs=[pl.BlockSpec((None, n_pieces * br, H), lambda p, h: (h, 0, 0)),
                   pl.BlockSpec((None, n_pieces * br), lambda p, h: (h, 0)),
                   pl.BlockSpec((None, n_pieces * br), lambda p, h: (h, 0))],
        out_shape=[jax.ShapeDtypeStruct((K, n_pieces * br, H), jnp.float32),
                   jax.ShapeDtypeStruct((K, n_pieces * br), jnp.float32),
                   jax.ShapeDtypeStruct((K, n_pieces * br), jnp.float32)],
        compiler_params=plgpu.CompilerParams(
            num_warps=cp.num_warps, num_stages=compiled_stages(cp.num_stages, 0 if table is None else 1)),
        interpret=interpret,
        name=f"attnlab_serving_r{br}_k{block_k}" + (f"_p{page_size}" if page_size else ""),
    )(cp.starts, cp.pieces.reshape(-1), *tables, qp, k, v)
    return o, m, l


def _targets(cp, q_starts, *, K, G, N, T_total):
    """(K, pieces * block_r) flat target index token * N + head of every partial row; T_total * N (dropped)
    where the row is past the piece's rows or the piece is empty."""
    import jax.numpy as jnp

    pc = cp.pieces
    b, row_off, n_rows, count = pc[:, 0], pc[:, 2], pc[:, 3], pc[:, 7]
    r = jnp.arange(cp.block_r, dtype=jnp.int32)
    rr = row_off[:, None] + r[None, :]                                   # (pieces, br) row within request
    tok = jnp.asarray(q_starts, jnp.int32)[b][:, None] + rr // G
    ok = (r[None, :] < n_rows[:, None]) & (count[:, None] > 0)
    h = jnp.arange(K, dtype=jnp.int32)[:, None, None]
    idx = tok[None] * N + h * G + (rr % G)[None]
    return jnp.where(ok[None], idx, T_total * N).reshape(K, -1)


def merge(parts, T_total: int, N: int, dtype):
    """Log-sum-exp merge of (idx, o, m, l) partial rows (idx: flat token * N + head, T_total * N = none)
    into (T_total, N, H) of ``dtype``; rows no partial reaches are 0."""
    import jax.numpy as jnp

    idx = jnp.concatenate([p[0].reshape(-1) for p in parts])
    o = jnp.concatenate([p[1].reshape(-1, p[1].shape[-1]) for p in parts])
    m = jnp.concatenate([p[2].reshape(-1) for p in parts])
    l = jnp.concatenate([p[3].reshape(-1) for p in parts])
    H = o.shape[-1]
    rows = T_total * N
    top = jnp.full((rows,), NEG, jnp.float32).at[idx].max(m, mode="drop")
    w = jnp.where(idx < rows, jnp.exp2(m - top[jnp.minimum(idx, rows - 1)]), 0.0)
    den = jnp.zeros((rows,), jnp.float32).at[idx].add(w * l, mode="drop")
    num = jnp.zeros((rows, H), jnp.float32).at[idx].add(w[:, None] * o, mode="drop")
    out = num / jnp.where(den == 0, 1.0, den)[:, None]
    return out.reshape(T_total, N, H).astype(dtype)


def serving_attention_pallas(q, k, v, q_starts, kv_lengths, *, plan: ServingPlan, scale: float | None = None,
                             page_table=None, soft_cap: float | None = None, interpret: bool | None = None):
    """The kernel on already validated inputs (see ``attnlab.serving_attention`` for the checks).

    q (T_total, N, H); k, v (B, S, K, H) or pages (P, page_size, K, H) with ``page_table`` (B, pages);
    ``plan`` from ``serving_plan.make_serving_plan`` for these sizes. ``scale`` and ``soft_cap`` are
    compiled in. Returns (T_total, N, H) in q's dtype."""
    import jax
    import jax.numpy as jnp

    T_total, N, H = (int(d) for d in q.shape)
    if page_table is None:
        B, S, K, _ = (int(d) for d in k.shape)
        page_size = None
        k, v = (x.reshape(B * S, K, H) for x in (k, v))
        table = None
    else:
        n_pages, page_size, K, _ = (int(d) for d in k.shape)
        S = int(page_table.shape[1]) * page_size
        k, v = (x.reshape(n_pages * page_size, K, H) for x in (k, v))
        table = jnp.asarray(page_table).astype(jnp.int32).reshape(-1)
    G = N // K
    scale = 1.0 / math.sqrt(H) if scale is None else float(scale)
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    qp = jnp.transpose(q.reshape(T_total, K, G, H), (1, 0, 2, 3)).reshape(K, T_total * G, H)
    parts = []
    for cp in plan.classes:
        o, m, l = _run_class(cp, qp, k, v, table, K=K, G=G, S=S, H=H, block_k=plan.block_k,
                             qk_scale=scale * LOG2E, page_size=page_size,
                             soft_cap=None if soft_cap is None else float(soft_cap) * LOG2E,
                             interpret=interpret, dtype_name=str(q.dtype))
        parts.append((_targets(cp, q_starts, K=K, G=G, N=N, T_total=T_total), o, m, l))
    return merge(parts, T_total, N, q.dtype)
