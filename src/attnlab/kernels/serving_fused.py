"""The serving kernel's two tile classes in one launch, so prefill (compute-bound) and decode
(bandwidth-bound) programs run at the same time (``ServingConfig(fused=True)``; opt-in, unmeasured).

In two launches a mixed batch takes at best the *sum* of its classes' rooflines: 54% of the combined
roofline for 2 prefill chunks of 2048 + 126 decodes at G=4 (docs/serving.md). Here one grid holds
P x K decode programs, then P x K prefill programs (1-D, decode first). The GPU places the first
~SMs programs one per SM, the next ones beside them, so with P x K ~ SMs most SMs hold one decode
and one prefill program (POD-Attention's pairing) when two fit in one SM: both classes compile
with the same warp count (4) and a 64-row prefill tile (``serving_plan`` sets them). Each program
runs its class's pieces (``serving.run_pieces``); the merges stay one launch per class.
"""
from __future__ import annotations

import functools

from .decode_plan import compiled_stages
from .serving import NF, partial_shapes, run_pieces


def _fused_kernel(sd_ref, pd_ref, sp_ref, pp_ref, *refs, programs: int, kv_heads: int, dec: dict, pre: dict):
    from jax import lax
    from jax.experimental import pallas as pl

    table_ref, rest = (refs[0], refs[1:]) if dec["page_size"] else (None, refs)
    q_ref, k_ref, v_ref, od, md, ld, op, mp, lp = rest
    i = pl.program_id(0)
    per_class = programs * kv_heads
    cls, r = lax.div(i, per_class), lax.rem(i, per_class)
    p, h = lax.div(r, kv_heads), lax.rem(r, kv_heads)

    @pl.when(cls == 0)
    def _():
        run_pieces(p, h, sd_ref, pd_ref, table_ref, q_ref, k_ref, v_ref, od, md, ld, **dec)

    @pl.when(cls == 1)
    def _():
        run_pieces(p, h, sp_ref, pp_ref, table_ref, q_ref, k_ref, v_ref, op, mp, lp, **pre)


def fused_pieces_call(classes, statics, q_flat, k, v, table, *, K: int, H: int, interpret: bool):
    """Both classes' piece kernels as one launch; returns [decode partials, prefill partials]."""
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    dec, pre = classes
    if dec.programs != pre.programs or dec.num_warps != pre.num_warps:
        raise ValueError("a fused launch needs both classes with one program count and one warp count "
                         f"(got {dec.programs}/{pre.programs} programs, {dec.num_warps}/{pre.num_warps} warps)")
    P = dec.programs

    def head(i):
        return lax.rem(lax.rem(i, P * K), K)

    full = lambda shape: pl.BlockSpec(shape, lambda i: (0,) * len(shape))   # noqa: E731
    kv_spec = pl.BlockSpec((int(k.shape[0]), None, H), lambda i: (0, head(i), 0))
    tables = [] if table is None else [table]
    outs, shapes = [], []
    for cp in classes:
        slots = int(cp.pieces.shape[0]) * cp.block_r
        outs += [pl.BlockSpec((None, slots, H), lambda i: (head(i), 0, 0)),
                 pl.BlockSpec((None, slots), lambda i: (head(i), 0)), pl.BlockSpec((None, slots), lambda i: (head(i), 0))]
        shapes += partial_shapes(cp, K, H)
    res = pl.pallas_call(
        functools.partial(_fused_kernel, programs=P, kv_heads=K, dec=statics[0], pre=statics[1]),
        grid=(2 * P * K,),
        in_specs=[full((P + 1,)), full((int(dec.pieces.shape[0]) * NF,)), full((P + 1,)),
                  full((int(pre.pieces.shape[0]) * NF,)), *[full(tuple(t.shape)) for t in tables],
                  full(tuple(q_flat.shape)), kv_spec, kv_spec],
        out_specs=outs,
        out_shape=shapes,
        compiler_params=plgpu.CompilerParams(
            num_warps=dec.num_warps,
            num_stages=compiled_stages(max(dec.num_stages, pre.num_stages), 0 if table is None else 1)),
        interpret=interpret,
        name=f"attnlab_serving_fused_r{dec.block_r}_r{pre.block_r}_k{pre.block_k}",
    )(dec.starts, dec.pieces.reshape(-1), pre.starts, pre.pieces.reshape(-1), *tables, q_flat, k, v)
    return [res[:3], res[3:]]
