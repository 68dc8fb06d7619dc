"""The serving kernel's merge: a unit's stream-K partials combined by log-sum-exp into its rows of the output.

One function body (``merge_unit``) in two places, by the plan's ``merge`` (``ServingConfig.merge``):

``"kernel"``: its own Pallas kernel per tile class after the pieces kernel (grid (units, K), ``merge_call``).
``"fused"``: at the end of the pieces kernel (``fused_finish``, called once a piece's online softmax is done).
    A unit of ONE piece normalises its rows and stores them (``store_rows``): no partial, no merge. A unit of
    several: each piece stores its partial (O, m, l), then takes a ticket on its (unit, KV head) int32 counter
    (an atomic add, acquire-release at GPU scope, after a CTA barrier so that every thread's stores of the
    partial come before it); the piece that draws the last ticket merges all of the unit's partials (its own
    included, from memory) and stores the rows. The counters start at 0 each call (a zeros array aliased into
    the kernel: one more fill of units x K int32 per class). A step is then one launch per tile class.

The math (``merge_unit``): O = sum 2^(m_i - M) O_i / sum 2^(m_i - M) l_i over the unit's pieces i, 2-4 pieces a
trip (``merge_pieces_per_trip``: a long request's tens of pieces wait for memory once a trip, not once a piece);
with sinks (log2 units, (N,)), each row's denominator gains 2^(sink - M) of its query head, once, after its
pieces; rows go to their (token, head) places of the output in its dtype (a row scatter). A one-piece unit's
rows are the same numbers as its merge of one piece (2^(m - m) = 1, 2^(NEG - m) = 0). The output starts as zeros,
so padding tokens' rows stay 0.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .decode import NEG
from .serving_plan import UNIT_FIELDS

NU = len(UNIT_FIELDS)
MERGES = ("kernel", "fused")


def row_index(q_start, row_off, row, h, groups: int, heads: int):
    """Flat (token * N + head) index of rows ``row_off + row`` of a request starting at token q_start, KV head h."""
    r = row_off + row
    return (q_start + lax.div(r, groups)) * heads + h * groups + lax.rem(r, groups)


def unit_fields(units_ref, u):
    """(q_start, row_offset, rows, first_piece, end_piece) of unit u (``UNIT_FIELDS``)."""
    return tuple(units_ref[u * NU + f] for f in range(NU))


def store_rows(acc, top, den, *, h, q_start, row_off, n_rows, sinks_ref, out_ref, groups: int, heads: int,
               block_r: int, spare: int):
    """A unit's rows: acc (block_r, H) float32 unnormalised, top / den (block_r,) its max (log2) and sum; the sink
    of each row's query head joins the denominator; stored in out's dtype at rows < n_rows."""
    row, dims = lax.iota(jnp.int32, block_r), lax.iota(jnp.int32, acc.shape[-1])
    if sinks_ref is not None:   # the sink (log2 units): one more logit of the row's head, with no value
        sink = plgpu.load(sinks_ref.at[h * groups + lax.rem(row_off + row, groups)])
        new = jnp.maximum(top, sink)
        a = jnp.exp2(top - new)
        acc, den = acc * a[:, None], den * a + jnp.exp2(sink - new)
    ok = row < n_rows
    # masked rows point at the spare row: never stored on the GPU; interpret mode stores a masked row's
    # old value back, which must not land on a row this store writes
    idx = jnp.where(ok, row_index(q_start, row_off, row, h, groups, heads), spare)
    out = acc / jnp.where(den == 0, 1.0, den)[:, None]
    plgpu.store(out_ref.at[idx[:, None], dims[None, :]], out.astype(out_ref.dtype),
                mask=jnp.broadcast_to(ok[:, None], (block_r, acc.shape[-1])))


def merge_unit(u, h, units_ref, o_ref, m_ref, l_ref, sinks_ref, out_ref, *, groups: int, heads: int, block_r: int,
               spare: int, per_trip: int = 1):
    """Unit u's pieces' partials (slots first_piece .. end_piece-1 of o/m/l_ref, KV head h's) combined and stored."""
    H = o_ref.shape[-1]
    q_start, row_off, n_rows, first, end = unit_fields(units_ref, u)

    def body(i, c):
        # ``per_trip`` pieces' independent loads a trip; past ``end``: its last piece again, weighed 0 (finite
        # NEG: a piece that saw no key has O = l = 0)
        acc, top, den = c
        js = [first + i * per_trip + d for d in range(per_trip)]
        at = [jnp.minimum(j, end - 1) * block_r for j in js]
        ms, ls = ([plgpu.load(r.at[pl.ds(a, block_r)]) for a in at] for r in (m_ref, l_ref))
        os_ = [plgpu.load(o_ref.at[pl.ds(a, block_r), :]) for a in at]
        new = functools.reduce(jnp.maximum, ms, top)
        a = jnp.exp2(top - new)
        ws = [jnp.where(j < end, jnp.exp2(mj - new), 0.0) for j, mj in zip(js, ms)]
        acc = acc * a[:, None] + sum(w[:, None] * o for w, o in zip(ws, os_))
        return acc, new, den * a + sum(w * lj for w, lj in zip(ws, ls))

    init = (jnp.zeros((block_r, H), jnp.float32), jnp.full((block_r,), NEG, jnp.float32),
            jnp.zeros((block_r,), jnp.float32))
    acc, top, den = lax.fori_loop(0, lax.div(end - first + per_trip - 1, per_trip), body, init)
    store_rows(acc, top, den, h=h, q_start=q_start, row_off=row_off, n_rows=n_rows, sinks_ref=sinks_ref,
               out_ref=out_ref, groups=groups, heads=heads, block_r=block_r, spare=spare)


def store_partial(j, acc, m, l, o_ref, m_ref, l_ref):
    """Piece j's partial to its slot: O (block_r, H), m and l (block_r,), float32."""
    slot = j * acc.shape[0]
    plgpu.store(o_ref.at[pl.ds(slot, acc.shape[0]), :], acc)
    plgpu.store(m_ref.at[pl.ds(slot, acc.shape[0])], m)
    plgpu.store(l_ref.at[pl.ds(slot, acc.shape[0])], l)


def fused_finish(j, acc, m, l, *, h, piece_units_ref, units_ref, o_ref, m_ref, l_ref, count_ref, sinks_ref, out_ref,
                 interpret: bool, **merge):
    """The end of piece j (unit ``piece_units_ref[j]``) in the pieces kernel (module docstring, ``"fused"``)."""
    u = piece_units_ref[j]
    q_start, row_off, n_rows, first, end = unit_fields(units_ref, u)
    rows = dict(h=h, q_start=q_start, row_off=row_off, n_rows=n_rows, sinks_ref=sinks_ref, out_ref=out_ref,
                **{k: merge[k] for k in ("groups", "heads", "block_r", "spare")})
    pl.when(end - first == 1)(lambda: store_rows(acc, m, l, **rows))

    @pl.when(end - first > 1)
    def _shared():
        store_partial(j, acc, m, l, o_ref, m_ref, l_ref)
        if not interpret:       # interpret mode runs programs one after another (and has no barrier)
            plgpu.debug_barrier()   # a CTA barrier (bar.sync): every thread's partial stores before the ticket
        ticket = plgpu.atomic_add(count_ref, u, jnp.int32(1))     # acq_rel, GPU scope (Pallas Triton's default)
        pl.when(ticket == end - first - 1)(
            lambda: merge_unit(u, h, units_ref, o_ref, m_ref, l_ref, sinks_ref, out_ref, **merge))


def merge_pieces_per_trip(block_r: int, head_dim: int) -> int:
    """Pieces the merge loads a trip: 4 up to 32 x 128 floats of O a piece, else 2 (ptxas: 80-138 registers)."""
    return 4 if block_r * head_dim <= 4096 else 2


def merge_static(cp, out, *, G, N, H, interpret) -> dict:
    """The merge's compiled-in parameters: ``spare`` is a row past the output (interpret mode: its extra row)."""
    return dict(groups=G, heads=N, block_r=cp.block_r, spare=int(out.shape[0]) - (1 if interpret else 0),
                per_trip=merge_pieces_per_trip(cp.block_r, H))


def merge_name(cp) -> str:
    kind = "decode" if cp.decode else "prefill"     # kernel names, as CUPTI reports them
    return f"attnlab_serving_{kind}_merge_r{cp.block_r}"


def _merge_kernel(units_ref, o_ref, m_ref, l_ref, _, *refs, **merge):
    sinks_ref, out_ref = refs if len(refs) == 2 else (None, refs[0])
    merge_unit(pl.program_id(0), pl.program_id(1), units_ref, o_ref, m_ref, l_ref, sinks_ref, out_ref, **merge)


def merge_call(cp, partials, out, *, K, G, N, H, interpret, sinks=None):
    """One class's merge kernel (grid (units, K)) into ``out`` (T_total * N [+ 1], H), aliased;
    ``sinks``: None or (N,) float32 sinks in log2 units, added to each row's denominator."""
    n_units = int(cp.units.shape[0])
    slots = int(cp.pieces.shape[0]) * cp.block_r
    full = lambda shape: pl.BlockSpec(shape, lambda u, h: (0,) * len(shape))   # noqa: E731
    per_head = [pl.BlockSpec((None, slots, H), lambda u, h: (h, 0, 0)), pl.BlockSpec((None, slots), lambda u, h: (h, 0)),
                pl.BlockSpec((None, slots), lambda u, h: (h, 0))]
    return pl.pallas_call(
        functools.partial(_merge_kernel, **merge_static(cp, out, G=G, N=N, H=H, interpret=interpret)),
        grid=(n_units, K),
        in_specs=[full((n_units * NU,)), *per_head, full(tuple(out.shape)), *([] if sinks is None else [full((N,))])],
        out_specs=full(tuple(out.shape)),
        out_shape=jax.ShapeDtypeStruct(out.shape, out.dtype),
        input_output_aliases={4: 0},
        compiler_params=plgpu.CompilerParams(num_warps=8 if cp.block_r * H > 8192 else 4, num_stages=1),
        interpret=interpret,
        name=merge_name(cp),
    )(cp.units.reshape(-1), *partials, out, *([] if sinks is None else [sinks]))
