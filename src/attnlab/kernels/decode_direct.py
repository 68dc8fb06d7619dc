"""The one-split decode launch: O normalised in registers and stored in q's dtype straight into (B, T, N, H).

When a launch has one split (``decode_plan.Plan.direct``) there is nothing to combine: each program holds its
rows' whole softmax (running max m, sum l, unnormalised O in float32), so it divides by the sum itself and
stores the result, and no partials (B, K, 1, T*G, H+2) float32 are written and read back by a second kernel
(``split_combine``): one launch. The math is the combine's at one split: O = acc / l, with attention sinks
(log2 units) M = max(m, sink), O = 2^(m - M) acc / (2^(m - M) l + 2^(sink - M)); a row that saw no key (l = 0)
gives 0.

q is read from, and O written to, (B, T, K, G, H) views of the (B, T, N, H) arrays (free reshapes): packed row
r = t * G + g of KV head h is query t's head h * G + g, so one (b, h) program's block is (T, G, H) and its rows
are gathered and scattered in place (each row's H elements contiguous); no transpose of q at T > 1 either.
Rows past T*G (t >= T) are masked: never loaded or stored (in Pallas interpret mode their out-of-range index
is dropped by the scatter, so they cannot overwrite a real row). The sinks come in as a (K, G) view of (N,).
Compiled for sm_90 by pip's Triton 3.6 on a CPU (``benchmarks/decode/direct_ttir_cpu.py``, gpt-oss's windowed
decode): O leaves in 16-byte stores, q arrives in 16-byte loads, registers within 0-14 of the partials' kernel,
no spills. Not yet timed on a GPU (``benchmarks/decode/window_gpu.py --direct``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .split_combine import LOG2E


def packed_inputs(q, sinks, kv_heads: int) -> list:
    """q (B, T, N, H) -> (B, T, K, G, H), then sinks (N,) -> (K, G) in their own dtype (converted in the kernel)."""
    B, T, N, H = (int(d) for d in q.shape)
    G = N // kv_heads
    return [q.reshape(B, T, kv_heads, G, H)] + ([] if sinks is None else [jnp.asarray(sinks).reshape(kv_heads, G)])


def block_specs(q_len: int, groups: int, head_dim: int, bk, with_sinks: bool):
    """(q's and the sinks' specs, O's spec) for the grid (row tile, split, b * K + h); ``bk(x)`` -> (b, h)."""
    rows = pl.BlockSpec((None, q_len, None, groups, head_dim), lambda r, j, x: (bk(x)[0], 0, bk(x)[1], 0, 0))
    sinks = [pl.BlockSpec((None, groups), lambda r, j, x: (bk(x)[1], 0))] if with_sinks else []
    return [rows] + sinks, rows


def out_struct(q, kv_heads: int):
    """The output's (B, T, K, G, H) view, in q's dtype."""
    B, T, N, H = (int(d) for d in q.shape)
    return jax.ShapeDtypeStruct((B, T, kv_heads, N // kv_heads, H), q.dtype)


def _index(row, groups: int, head_dim: int):
    """(t, g, column) index arrays of packed rows ``row`` (block_r,) in a (T, G, H) block, all arrays (Pallas
    interpret mode indexes either all slices or all arrays)."""
    return lax.div(row, groups)[:, None], lax.rem(row, groups)[:, None], lax.iota(jnp.int32, head_dim)[None, :]


def load_q(q_ref, row, row_ok, *, groups: int):
    """The tile's q rows (block_r, H) from one (b, h)'s (T, G, H) block; zeros past T*G."""
    H = q_ref.shape[-1]
    mask = jnp.broadcast_to(row_ok[:, None], (row.shape[0], H))
    return plgpu.load(q_ref.at[_index(row, groups, H)], mask=mask, other=0)


def load_sinks(sinks_ref, row, row_ok, *, groups: int):
    """Each row's sink (block_r,) float32 in log2 units, from KV head h's (G,) sinks."""
    return plgpu.load(sinks_ref.at[lax.rem(row, groups)], mask=row_ok, other=0).astype(jnp.float32) * LOG2E


def store_normalised(o_ref, acc, m, l, row, row_ok, *, groups: int, sink=None):
    """O = acc / l (with ``sink``: 2^(m - M) acc / (2^(m - M) l + 2^(sink - M)), M = max(m, sink)) in o_ref's
    dtype, into the rows' places of one (b, h)'s (T, G, H) block; rows past T*G are not stored."""
    H = o_ref.shape[-1]
    if sink is None:
        w, den = 1.0, l
    else:
        top = jnp.maximum(m, sink)
        w = jnp.exp2(m - top)
        den = w * l + jnp.exp2(sink - top)
    factor = w / jnp.where(den == 0, 1.0, den)
    mask = jnp.broadcast_to(row_ok[:, None], (row.shape[0], H))
    plgpu.store(o_ref.at[_index(row, groups, H)], (acc * factor[:, None]).astype(o_ref.dtype), mask=mask)
