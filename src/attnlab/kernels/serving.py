"""attnlab's serving kernel in Pallas (Triton lowering): ragged requests, mixed prefill and decode, one plan.

Semantics: ``attnlab.serving_attention`` (q (T_total, N, H) packed token by token, q_starts (B+1,),
kv_lengths (B,) counting the new tokens; query i of request b at position kv_len - q_len + i sees the
keys at positions <= its own, and with a sliding window of left size ``left`` only those >= its position
- left; padding tokens give 0). A windowed call's plan starts each unit at its first visible key (at that key's
block in pages of >= block_k keys; ``serving_plan``), so the keys before the window are never loaded.

Layout and grid
    The rows of request b for KV head h are its tokens x G query heads, row r = t*G + g (GQA packing,
    as ``kernels.decode``): row r reads q[q_start + r // G, h*G + r % G] straight from q viewed as
    (T_total * N, H) (a row gather, no transpose). The plan (``kernels.serving_plan``) gives each tile
    class a list of pieces and each program a run of them; grid = (programs, K). Program (p, h) walks
    its pieces: for each, an online softmax (exp2, float32 scores, running max and sum) streams the
    piece's KV blocks of its request (block i from key kv_start + i * block_k; causal mask by position,
    keys past kv_len never loaded) and writes the unnormalised partial O (float32), m and l to the
    piece's slot. Every program of a class does the same number of KV blocks (stream-K). K/V rows of
    request b are rows b*S + pos of the contiguous cache viewed as (B*S, K, H), or go through the page
    table (the flattened table seen as one long sequence, ``paged_load.load_kv_block``).
Merge (``kernels.serving_merge``; the plan's ``merge``)
    "kernel": a second Pallas kernel, grid = (units, K): program (u, h) combines unit u's pieces (consecutive in
    the list) by log-sum-exp, O = sum 2^(m_i - M) O_i / sum 2^(m_i - M) l_i, 2-4 pieces a trip, and stores its
    rows in q's dtype at their (token, head) places of the output (a row scatter); with sinks, each row's
    denominator gains 2^(sink - M) of its query head there, once, after its pieces are merged. "fused": the same
    at the end of the pieces kernel: a one-piece unit stores its rows, the piece drawing a unit's last ticket
    merges it. The output starts as zeros (aliased through each class's merge), so the padding tokens' rows stay
    0. A step costs one zero fill plus two launches per tile class ("fused": one, and a zero fill of counters).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .decode import LOG2E, NEG
from .decode_plan import compiled_stages, kv_pairs_apply, kv_products
from .kv_dequant import (load_scale_block, pair_view, paired_v_scale, pv_top, quantized_pv, quantized_query,
                         quantized_scores, scale_block_spec, scale_inputs)
from .paged_load import load_kv_block
from .serving_merge import (NU, fused_finish, merge_call, merge_name, merge_pieces_per_trip,  # noqa: F401
                            merge_static, row_index, store_partial)
from . import serving_prefill_mgpu as prefill_mgpu
from .serving_plan import FIELDS, ServingPlan, page_mismatch
from .serving_slots import unsupported as prefill_unsupported

NF = len(FIELDS)


def _kernel(starts_ref, pieces_ref, *refs, fused: dict | None = None, **static):
    # fused: the merge at each piece's end (``serving_merge.fused_finish``; ``fused`` its static parameters)
    (piece_units_ref, units_ref), refs = (refs[:2], refs[2:]) if fused is not None else ((None, None), refs)
    table_ref, refs = (refs[0], refs[1:]) if static["page_size"] else (None, refs)
    # a quantized cache: its two scale refs after v_ref (``kernels.kv_dequant``)
    scale_refs, refs = (refs[3:5], refs[:3] + refs[5:]) if static.get("kv_scale") else ((None, None), refs)
    q_ref, k_ref, v_ref, *refs = refs
    finish = None
    if fused is not None:
        sinks_ref, refs = (refs[0], refs[1:]) if fused["sinks"] else (None, refs)
        _out_in, _counts_in, o_ref, m_ref, l_ref, out_ref, count_ref = refs
        merge = {k: x for k, x in fused.items() if k != "sinks"}
        finish = functools.partial(fused_finish, h=pl.program_id(1), piece_units_ref=piece_units_ref,
                                   units_ref=units_ref, o_ref=o_ref, m_ref=m_ref, l_ref=l_ref, count_ref=count_ref,
                                   sinks_ref=sinks_ref, out_ref=out_ref, **merge)
    else:
        o_ref, m_ref, l_ref = refs
    run_pieces(pl.program_id(0), pl.program_id(1), starts_ref, pieces_ref, table_ref, q_ref, k_ref, v_ref,
               o_ref, m_ref, l_ref, scale_refs=scale_refs, finish=finish, **static)


def run_pieces(p, h, starts_ref, pieces_ref, table_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, *, groups: int,
               heads: int, kv_len: int, block_r: int, block_k: int, qk_scale: float, page_size: int | None,
               soft_cap: float | None, split_mask: bool, window_left: int | None = None, kv_scale: str | None = None,
               scale_refs=(None, None), kv_mma: str | None = None, from_key: bool = False, finish=None,
               kv_pairs: str | None = None, interpret: bool = False):
    """Program p of KV head h: its run of pieces, each piece's partial (O, m, l) to its slot (module docstring),
    or ``finish(j, acc, m, l)`` instead (the fused merge). A quantized cache's products in ``kv_mma``
    (``kv_dequant.mma_query``; None: q's dtype), read as int16 pairs where ``kv_pairs`` (its FP8 dtype: a
    ``kv_dequant.pair_view`` cache; the V scale P leaves out, ``kv_dequant.pv_top``, multiplies each piece's acc
    before ``finish`` or its partial, as bytes' do); ``from_key``: the pieces' blocks start at a window's first key,
    not at multiples of block_k."""

    H = q_ref.shape[-1]
    row, dims, cols = (lax.iota(jnp.int32, n) for n in (block_r, H, block_k))
    aligned = kv_len % block_k == 0 and not from_key

    def piece(j, carry):
        b, q_start, row_off, n_rows, q_pos0, length, kv0, first, count = (pieces_ref[j * NF + f] for f in range(NF))
        row_ok = row < n_rows
        rmask = jnp.broadcast_to(row_ok[:, None], (block_r, H))
        idx = jnp.where(row_ok, row_index(q_start, row_off, row, h, groups, heads), 0)
        q = plgpu.load(q_ref.at[idx[:, None], dims[None, :]], mask=rmask, other=0)
        q_mma, row_factor = quantized_query(q, kv_mma, kv_pairs) if kv_scale else (q, None)
        q_pos = q_pos0 + lax.div(row_off + row, groups)
        base = b * kv_len
        off0 = jnp.where(count > 0, kv0 + first * block_k, 0)    # the first block, in the table even when empty
        top = pv_top(scale_refs[1], kv_scale, lambda: load_scale_block(
            scale_refs[1], layout=kv_scale, start=base + off0, kv_ok=off0 + cols < length, block_k=block_k,
            page_size=page_size, table_ref=table_ref), kv_pairs)

        def body(i, c, masked=True):
            acc, m, l = c
            start = kv0 + (first + i) * block_k
            pos = start + cols
            kv_ok = pos < length if masked else jnp.ones((block_k,), jnp.bool_)
            at = base + start
            load = functools.partial(load_kv_block, start=pl.multiple_of(at, block_k) if aligned else at,
                                     kv_ok=kv_ok, length=length, block_k=block_k, page_size=page_size,
                                     table_ref=table_ref)
            if kv_scale:
                scales = functools.partial(load_scale_block, layout=kv_scale, start=pl.multiple_of(at, block_k) if aligned
                                           else at, kv_ok=kv_ok, block_k=block_k, page_size=page_size, table_ref=table_ref)
                s = quantized_scores(q_mma, load(k_ref), scales(scale_refs[0]), row_factor, qk_scale, kv_pairs, interpret)
            else:
                s = plgpu.dot(q, load(k_ref), trans_b=True) * qk_scale
            if soft_cap is not None:
                s = soft_cap * jnp.tanh(s / soft_cap)
            if masked:
                visible = kv_ok[None, :] & (pos[None, :] <= q_pos[:, None])
                if window_left is not None:
                    visible = visible & (pos[None, :] >= q_pos[:, None] - window_left)
                s = jnp.where(visible, s, NEG)
            m_new = jnp.maximum(m, jnp.max(s, axis=1))
            # rows that have seen no key subtract 0 (2^(NEG - 0) = 0); an unmasked block's max is a real score
            m_use = jnp.where(m_new == NEG, 0.0, m_new) if masked else m_new
            alpha = jnp.exp2(m - m_use)
            pr = jnp.exp2(s - m_use[:, None])
            l = l * alpha + jnp.sum(pr, axis=1)
            v = load(v_ref)
            pv = (quantized_pv(pr, v, scales(scale_refs[1]), q_mma, kv_pairs, interpret, top) if kv_scale
                  else plgpu.dot(pr.astype(v.dtype), v))
            acc = acc * alpha[:, None] + pv
            return acc, m_new, l

        init = (jnp.zeros((block_r, H), jnp.float32), jnp.full((block_r,), NEG, jnp.float32),
                jnp.zeros((block_r,), jnp.float32))
        if split_mask:
            # blocks every row of the tile sees whole (below its first row's position and the length) run
            # without the mask's compares and selects: most of a prefill tile's blocks (counted from kv0)
            whole = lax.div(jnp.minimum(q_pos0 + lax.div(row_off, groups) + 1, length) - kv0, block_k)
            n_lo = 0
            if window_left is not None:     # ... and at or past its last row's window start (kv0: its first row's)
                last_pos = q_pos0 + lax.div(row_off + n_rows - 1, groups)
                lo_whole = lax.div(jnp.maximum(last_pos - window_left, 0) - kv0 + block_k - 1, block_k)
                n_lo = jnp.clip(lo_whole - first, 0, count)
                init = lax.fori_loop(0, n_lo, body, init)
            n_whole = jnp.clip(whole - first, n_lo, count)
            init = lax.fori_loop(n_lo, n_whole, functools.partial(body, masked=False), init)
            acc, m, l = lax.fori_loop(n_whole, count, body, init)
        else:
            acc, m, l = lax.fori_loop(0, count, body, init)
        acc = paired_v_scale(acc, top)     # every piece's, whichever merge
        (finish or functools.partial(store_partial, o_ref=o_ref, m_ref=m_ref, l_ref=l_ref))(j, acc, m, l)
        return carry

    lax.fori_loop(starts_ref[p], starts_ref[p + 1], piece, 0)


def class_static(cp, *, G, N, S, qk_scale, page_size, soft_cap, window_left=None, kv_scale=None, kv_mma=None,
                 kv_pairs=None, interpret=False) -> dict:
    """The compiled-in parameters of one class's piece loop (``run_pieces``)."""
    return dict(groups=G, heads=N, kv_len=S, block_r=cp.block_r, block_k=cp.block_k, qk_scale=qk_scale,
                page_size=page_size, soft_cap=soft_cap, split_mask=cp.whole_blocks, window_left=window_left,
                kv_scale=kv_scale, kv_mma=kv_mma, from_key=cp.window_from_key, kv_pairs=kv_pairs, interpret=interpret)


def partial_shapes(cp, K: int, H: int):
    """The float32 partials (O, m, l) of one class: a (block_r, H) / (block_r,) slot per piece, per KV head."""
    slots = int(cp.pieces.shape[0]) * cp.block_r
    return [jax.ShapeDtypeStruct((K, slots, H), jnp.float32), jax.ShapeDtypeStruct((K, slots), jnp.float32),
            jax.ShapeDtypeStruct((K, slots), jnp.float32)]


def kernel_name(cp, page_size, merge: bool = False, fused: bool = False) -> str:
    """The launch's name, as CUPTI reports it: a class's pieces kernel (``fused``: with the merge at its end)
    or its merge kernel."""
    if merge:
        return merge_name(cp)
    kind = "decode" if cp.decode else "prefill"
    return (f"attnlab_serving_{kind}_r{cp.block_r}_k{cp.block_k}" + (f"_p{page_size}" if page_size else "")
            + ("_fused" if fused else ""))


def _pieces_call(cp, q_flat, k, v, table, *, K, H, static, interpret, scales=(), fused=None):
    """One tile class's piece kernel: grid (programs, K); returns its partials. ``fused``: None, or dict(out=, sinks=,
    merge=) to merge at the pieces' end into ``out`` (aliased; ``merge``: ``serving_merge.merge_static``) and
    return it."""
    n_pieces, n_units = int(cp.pieces.shape[0]), int(cp.units.shape[0])
    full = lambda shape: pl.BlockSpec(shape, lambda p, h: (0,) * len(shape))   # noqa: E731
    kv_spec = pl.BlockSpec((int(k.shape[0]), None, int(k.shape[-1])), lambda p, h: (0, h, 0))   # pairs: H / 2
    tables = [] if table is None else [table]
    slots = n_pieces * cp.block_r
    ins = [cp.starts, cp.pieces.reshape(-1), *tables, q_flat, k, v, *scales]
    in_specs = [full((cp.programs + 1,)), full((n_pieces * NF,)), *[full(tuple(t.shape)) for t in tables],
                full(tuple(q_flat.shape)), kv_spec, kv_spec,
                *[scale_block_spec(static["kv_scale"], x.shape, lambda p, h: (0, h)) for x in scales]]
    out_specs = [pl.BlockSpec((None, slots, H), lambda p, h: (h, 0, 0)), pl.BlockSpec((None, slots), lambda p, h: (h, 0)),
                 pl.BlockSpec((None, slots), lambda p, h: (h, 0))]
    out_shape, aliases, kernel = partial_shapes(cp, K, H), {}, functools.partial(_kernel, **static)
    if fused is not None:
        out, sinks = fused["out"], fused["sinks"]
        # the pieces' units and the units' fields after pieces; sinks, then the aliased output and counters last
        ins[2:2] = [cp.piece_units, cp.units.reshape(-1)]
        in_specs[2:2] = [full((n_pieces,)), full((n_units * NU,))]
        counts = pl.BlockSpec((None, n_units), lambda p, h: (h, 0))
        ins += [*([] if sinks is None else [sinks]), out, jnp.zeros((K, n_units), jnp.int32)]
        in_specs += [*([] if sinks is None else [full(tuple(sinks.shape))]), full(tuple(out.shape)), counts]
        out_specs += [full(tuple(out.shape)), counts]
        out_shape += [jax.ShapeDtypeStruct(out.shape, out.dtype), jax.ShapeDtypeStruct((K, n_units), jnp.int32)]
        aliases = {len(ins) - 2: 3, len(ins) - 1: 4}
        kernel = functools.partial(kernel, fused=dict(fused["merge"], sinks=sinks is not None, interpret=interpret))
    res = pl.pallas_call(
        kernel,
        grid=(cp.programs, K),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        input_output_aliases=aliases,
        compiler_params=plgpu.CompilerParams(
            num_warps=cp.num_warps, num_stages=compiled_stages(cp.num_stages, 0 if table is None else 1)),
        interpret=interpret,
        name=kernel_name(cp, static["page_size"], fused=fused is not None),
    )(*ins)
    return res if fused is None else res[3]


def serving_attention_pallas(q, k, v, q_starts, kv_lengths, *, plan: ServingPlan, scale: float | None = None,
                             page_table=None, soft_cap: float | None = None, interpret: bool | None = None,
                             sinks=None, k_scale=None, v_scale=None, kv_scale: str | None = None):
    """The kernel on already validated inputs (see ``attnlab.serving_attention`` for the checks).

    q (T_total, N, H); k, v (B, S, K, H) or pages (P, page_size, K, H) with ``page_table`` (B, pages);
    ``plan`` from ``serving_plan.make_serving_plan`` for these sizes (it carries the lengths:
    ``q_starts`` and ``kv_lengths`` are not read again) and this window: the left size of the sliding
    window is the plan's ``window_left`` (None: none). ``scale`` and ``soft_cap`` are compiled in.
    ``sinks``: None or (N,) float logits (gpt-oss's attention sinks), added once per row by the merge.
    A quantized cache: ``k_scale``/``v_scale`` in the layout ``kv_scale``, dequantized in registers
    (``kernels.kv_dequant``), the products in the plan's ``kv_mma`` (``decode_plan.kv_products``: float16 for FP8
    and a bfloat16 q), read as int16 pairs where the plan's ``kv_pairs`` applies (``kv_pairs_apply``). A windowed
    plan made for a contiguous cache or small pages on pages of >= block_k keys is a ValueError
    (``serving_plan.page_mismatch``). Returns (T_total, N, H) in q's dtype."""
    del q_starts, kv_lengths
    T_total, N, H = (int(d) for d in q.shape)
    k4, v4 = k, v         # as given: for the Mosaic GPU prefill (``plan.prefill``)
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
    if why := page_mismatch(plan, page_size):
        raise ValueError(why)
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    if plan.prefill is not None and (why := prefill_unsupported(
            plan.prefill, kv_len_max=S, heads=N, kv_heads=K, head_dim=H, dtype=q.dtype, page_size=page_size,
            soft_cap=soft_cap, quantized=bool(kv_scale), interpret=interpret)):
        raise ValueError(why)
    G = N // K
    scale = 1.0 / math.sqrt(H) if scale is None else float(scale)
    mma = kv_products(plan.kv_mma, str(k.dtype) if kv_scale else None, str(q.dtype))
    pairs = str(k.dtype) if kv_scale and kv_pairs_apply(plan.kv_pairs, str(k.dtype), mma, q.dtype) else None
    k, v = (pair_view(k), pair_view(v)) if pairs else (k, v)      # (rows, K, H / 2) int16
    # padding tokens' rows stay 0, the Mosaic GPU prefill's tokens' rows are its output (``serving_prefill_mgpu``),
    # or with its own stream added at the end; interpret mode needs a spare row past the end (``store_rows``)
    slots = None if plan.prefill is None else functools.partial(
        prefill_mgpu.run, scale=scale, window_left=plan.window_left, interpret=interpret)
    beside = None if slots is None or interpret or not plan.prefill.stream else prefill_mgpu.on_stream(
        lambda *a: slots(*a[:5], sinks=a[5]), plan.prefill.stream)(q, k4, v4, page_table, plan.prefill, sinks)
    out = jnp.zeros((T_total * N, H), q.dtype) if slots is None or beside is not None else slots(
        q, k4, v4, page_table, plan.prefill, sinks=sinks).reshape(T_total * N, H)
    out = jnp.concatenate([out, jnp.zeros((1, H), q.dtype)]) if interpret else out
    q_flat = q.reshape(T_total * N, H)
    statics = [class_static(cp, G=G, N=N, S=S, qk_scale=scale * LOG2E, page_size=page_size,
                            soft_cap=None if soft_cap is None else float(soft_cap) * LOG2E,
                            window_left=plan.window_left, kv_scale=kv_scale, kv_mma=mma, kv_pairs=pairs,
                            interpret=interpret) for cp in plan.classes]
    scales = scale_inputs(k_scale, v_scale, kv_scale, K=K)
    sinks = None if sinks is None else jnp.asarray(sinks).astype(jnp.float32) * LOG2E
    call = functools.partial(_pieces_call, q_flat=q_flat, k=k, v=v, table=table, K=K, H=H, interpret=interpret,
                             scales=scales)
    if plan.merge == "fused":      # one launch per class: each merges its units at their pieces' end
        for cp, st in zip(plan.classes, statics):
            merge = merge_static(cp, out, G=G, N=N, H=H, interpret=interpret)
            out = call(cp, static=st, fused=dict(out=out, sinks=sinks, merge=merge))
    else:
        partials = [call(cp, static=st) for cp, st in zip(plan.classes, statics)]
        for cp, parts in zip(plan.classes, partials):
            out = merge_call(cp, parts, out, K=K, G=G, N=N, H=H, interpret=interpret, sinks=sinks)
    out = out[:T_total * N].reshape(T_total, N, H) if interpret else out.reshape(T_total, N, H)
    return out if beside is None else out + beside
