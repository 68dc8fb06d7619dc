"""Quantized KV caches inside attnlab's kernels (decode and serving): scale loads and dequantization in registers.

A quantized cache (``attnlab.core.kv_quant``: FP8 e4m3/e5m2 or int8 values, float32 scales per tensor, per
KV head, per page or per token) is read as stored, 1 byte per element; each block's keys and values are
converted to q's dtype after the load (exact: every FP8 and int8 value is a bfloat16 and a float16) and
their scales applied in float32 in registers:

* keys: q . (s_j k_j) = s_j (q . k_j): the score column of key j times its scale (``dequantized_scores``),
  block_r x block_k multiplies instead of block_k x H, before the soft cap and the mask;
* values: sum_j p_j s_j v_j: column j of P times its value scale before P is rounded for the MMA
  (``dequantized_pv``; float16 dequantizes the value rows instead, out of float16's subnormals); a
  per-head scale multiplies the product.

FP8 read as pairs (``DecodeConfig.kv_pairs``, ``ServingConfig.kv_pairs``): Triton gives an FP8 block's conversion the MMA operand's layout,
which pairs keys along the contraction; V (S, H) stores them a row apart, and sm_90 has no 8-bit ldmatrix, so
each value byte was read from shared memory alone, and the 8-bit operands' layout (kWidth 4) kept q and P from
ldmatrix too. Read as int16 pairs of neighbouring columns (``pair_view``), each block converts in registers into
its even and odd columns (``byte_planes``: one byte permute and two conversions per four values) and each product
runs as two of half the width (``paired_scores``, ``paired_pv``), every operand 16-bit. The kernels call
``quantized_query``, ``pv_top`` before their loop, ``quantized_scores``, ``quantized_pv`` and, after it,
``paired_v_scale``: one body for bytes and pairs.

The scales come in as refs beside K and V (``scale_inputs``, ``scale_block_spec``) and are loaded per block
(``load_scale_block``) with the same rows, page table included, as ``paged_load.load_kv_block``.
"""
from __future__ import annotations
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def mma_query(q, mma_dtype):
    """q (block_r, H) as the quantized cache's products take it, and the float32 factor per row (block_r,) that
    undoes its scaling (None: unscaled). ``mma_dtype`` None: q's dtype (the cache converted to it, exact);
    ``"float16"``: a bfloat16/float32 q scaled per row by the power of two 2^-e that puts its absmax in [1, 2)
    (exact: the exponent field only), then rounded to float16, whose 11 bits hold bfloat16's 8 from 2^-14 of
    the row's absmax on. FP8 e4m3/e5m2 and int8 convert to float16 in one or two instructions per pair of
    values on sm_89+, to bfloat16 through float32 (e4m3: three)."""
    if mma_dtype is None or q.dtype == jnp.float16:
        return q, None
    qf = q.astype(jnp.float32)
    e_bits = lax.bitcast_convert_type(jnp.max(jnp.abs(qf), axis=1), jnp.int32) & 0x7F800000    # 2^e, e <= 126
    inv = lax.bitcast_convert_type((254 << 23) - e_bits, jnp.float32)                             # 2^-e
    return (qf * inv[:, None]).astype(jnp.float16), lax.bitcast_convert_type(e_bits, jnp.float32)


def dequantized_scores(q, k, k_scale, row_factor=None):
    """q k^T (block_r, block_k) float32 of a quantized key block: the stored keys converted to q's dtype (exact:
    every FP8 e4m3/e5m2 and int8 value is a bfloat16 and a float16), their scales multiplying the score columns
    (one scale per key, or one per head): q . (s_j k_j) = s_j (q . k_j), in float32, block_r x block_k products
    instead of block_k x H. ``row_factor``: ``mma_query``'s, multiplying the score rows."""
    s = plgpu.dot(q, k.astype(q.dtype), trans_b=True)
    if row_factor is not None:
        s = s * row_factor[:, None]
    return s * (k_scale[None, :] if k_scale.ndim else k_scale)


def dequantized_pv(p, v, v_scale, dtype):
    """P V (block_r, H) float32 of a quantized value block, the MMA in ``dtype``: each key's value scale over the
    block's largest multiplies its column of P (float32) before P is rounded to ``dtype``, that largest multiplying
    the product. Why the ratio: in float16, p * scale of a cache with small scales (e5m2's absmax / 57344) falls
    below the normal range, while p * (s_j / s_max) <= 1 loses only what is below 2^-24 of the block's largest
    term; in bfloat16, a block of one scale (a page's) keeps P as it is, its largest term (p = 1) exact, as a
    per-tensor scale's (p * scale rounded: int8 per page 1.3x the error of per tensor). A per-head scale
    multiplies the product."""
    if not v_scale.ndim:
        return plgpu.dot(p.astype(dtype), v.astype(dtype)) * v_scale
    top = jnp.maximum(jnp.max(jnp.abs(v_scale)), 1e-30)     # a negative scale's sign stays in the ratio
    return plgpu.dot((p * (v_scale / top)[None, :]).astype(dtype), v.astype(dtype)) * top


#: 4 FP8 bytes (two int16 pairs: columns 2c, 2c+1 and 2c+2, 2c+3) -> f16x2 of the even (``e``) or odd (``o``)
#: columns; both planes permute alike, so ptxas can keep one ``prmt`` for the two
_PLANE_ASM = """{ .reg .b32 t; .reg .b16 e, o;
prmt.b32 t, $1, 0, 0x3120;
mov.b32 {e, o}, t;
cvt.rn.f16x2.%s $0, %s; }"""


def pair_view(x):
    """An FP8 cache (..., H) as int16 (..., H / 2): each element the bytes of columns 2c (low) and 2c + 1."""
    return lax.bitcast_convert_type(x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2), jnp.int16)


def byte_planes(w, fp8_dtype, interpret: bool):
    """(even, odd) float16 (n, H/2) columns of an (n, H/2) int16 block of ``pair_view``'s. On the GPU inline PTX per
    two pairs and plane (a byte permute, one ``cvt.f16x2``); the int16 load gives the product 16-bit operands."""
    fp8 = jnp.dtype(fp8_dtype)
    if interpret:
        u = lax.bitcast_convert_type(w, jnp.uint16)
        return tuple(lax.bitcast_convert_type(b.astype(jnp.uint8), fp8).astype(jnp.float16) for b in (u & 0xFF, u >> 8))
    kind = "e4m3x2" if fp8 == jnp.float8_e4m3fn else "e5m2x2"
    out = [jax.ShapeDtypeStruct(w.shape, jnp.float16)]
    return tuple(plgpu.elementwise_inline_asm(_PLANE_ASM % (kind, half), args=[w], constraints="=r,r", pack=2,
                                              result_shape_dtypes=out)[0] for half in "eo")


def query_planes(q):
    """q (block_r, H) as its (even, odd) columns, each (block_r, H / 2)."""
    return lax.unstack(q.reshape(q.shape[0], q.shape[1] // 2, 2), axis=2)


def paired_scores(q_planes, k_words, k_scale, fp8_dtype, interpret: bool, row_factor=None, qk_scale=1.0):
    """``dequantized_scores`` of a ``pair_view`` key block times ``qk_scale``: q_even k_even^T + q_odd k_odd^T,
    the factors of a row (``row_factor``, ``qk_scale``, a per-head key scale) multiplied once per row."""
    ke, ko = byte_planes(k_words, fp8_dtype, interpret)
    s = plgpu.dot(q_planes[0], ke, trans_b=True) + plgpu.dot(q_planes[1], ko, trans_b=True)
    rows = qk_scale * (k_scale if not k_scale.ndim else 1.0)
    rows = rows if row_factor is None else row_factor * rows
    s = s * (rows[:, None] if jnp.ndim(rows) else rows)
    return s * k_scale[None, :] if k_scale.ndim else s


def paired_pv(p, v_words, v_scale, fp8_dtype, interpret: bool, inv_top=None):
    """``dequantized_pv`` (float16 products) of a ``pair_view`` value block: P V as (P v_even, P v_odd)
    interleaved back into (block_r, H). Per-key scales multiply P's columns over the loop's reference R
    (``inv_top`` = 1 / R, ``pv_top``); R and a per-head scale are left to the caller (``paired_v_scale``)."""
    ve, vo = byte_planes(v_words, fp8_dtype, interpret)
    if v_scale.ndim:
        p = p * (v_scale * inv_top)[None, :]
    p = p.astype(jnp.float16)
    return jnp.stack([plgpu.dot(p, ve), plgpu.dot(p, vo)], axis=-1).reshape(p.shape[0], 2 * ve.shape[1])


def pv_top(v_scale_ref, layout: str | None, first_scales, pairs=None):
    """(R, 1 / R): the float32 value scale a loop of ``paired_pv`` blocks leaves to its accumulator, or None (read as
    bytes, or unquantized). Per head / per tensor the scale itself. Per token / page the largest of the loop's first
    block's scales (``first_scales()`` loads them, (block_k,), 0 where masked): P's columns become p * s / R, so
    float16 holds keys whose scale is from 2^-14 R (below: subnormal, coarser than e4m3's own rounding only under
    about 2^-21 R) to 2^15 R before it overflows, a spread of value magnitudes no cache quantized per token shows;
    once per loop, where a block max cost every block a reduction over the warps."""
    if not pairs or layout is None:
        return None
    if layout in ("head", "tensor"):
        top = v_scale_ref[0]
    else:
        top = jnp.maximum(jnp.max(jnp.abs(first_scales())), jnp.finfo(jnp.float32).tiny)
    return top, 1.0 / top


def quantized_query(q, kv_mma, pairs=None):
    """``mma_query``'s (q, row factor); q as its ``query_planes`` where ``pairs`` (the FP8 dtype of a ``pair_view``
    cache, or None: read as bytes)."""
    q_mma, row_factor = mma_query(q, kv_mma)
    return (query_planes(q_mma) if pairs else q_mma), row_factor


def quantized_scores(q_mma, k, k_scale, row_factor, qk_scale, pairs=None, interpret: bool = False):
    """q k^T times ``qk_scale`` of a quantized key block (``quantized_query``'s q): ``paired_scores`` where ``pairs``,
    else ``dequantized_scores``."""
    if pairs:
        return paired_scores(q_mma, k, k_scale, pairs, interpret, row_factor, qk_scale)
    return dequantized_scores(q_mma, k, k_scale, row_factor) * qk_scale


def quantized_pv(p, v, v_scale, q_mma, pairs=None, interpret: bool = False, top=None):
    """P V of a quantized value block, the MMA in ``quantized_query``'s dtype: ``paired_pv`` where ``pairs`` (float16;
    ``top``: ``pv_top``'s, its R left to ``paired_v_scale``), else ``dequantized_pv``."""
    if pairs:
        return paired_pv(p, v, v_scale, pairs, interpret, None if top is None else top[1])
    return dequantized_pv(p, v, v_scale, q_mma.dtype)


def paired_v_scale(acc, top):
    """The accumulator of ``quantized_pv`` blocks times ``pv_top``'s R (one factor for every block of the loop: once
    per row, after it, before anything reads acc: partials carry the scaling of bytes' ones); acc unchanged
    without (``top`` None)."""
    return acc if top is None else acc * top[0]


def load_scale_block(ref, *, layout: str, start, kv_ok, block_k: int, page_size: int | None, table_ref=None):
    """The float32 scales of a quantized cache's keys start .. start+block_k-1 (``attnlab.core.kv_quant``):
    (block_k,) for the ``token`` and ``page`` layouts (keys not kv_ok get 0, or their page's scale: never
    attended either way), a scalar for ``head``/``tensor``.

    ``ref``: ``head``/``tensor``: this kv head's (1,) scale; ``token``: its (S,) contiguous row of
    scales or its (P * page_size,) paged one (the rows of ``load_kv_block``); ``page``: its (P,) page scales."""
    if layout in ("head", "tensor"):
        return ref[0]
    if page_size is None:               # contiguous: token scales only
        return plgpu.load(ref.at[pl.ds(start, block_k)], mask=kv_ok, other=0)
    per_row = layout == "token"
    last_page = (ref.shape[0] // page_size if per_row else ref.shape[0]) - 1
    if block_k <= page_size:
        page = jnp.clip(table_ref[lax.div(start, page_size)], 0, last_page)
        if not per_row:                 # the block lies in one page: one scale
            return jnp.broadcast_to(ref[page], (block_k,))
        first_row = pl.multiple_of(page * page_size + lax.rem(start, page_size), block_k)
        return plgpu.load(ref.at[pl.ds(first_row, block_k)], mask=kv_ok, other=0)
    pos = start + lax.iota(jnp.int32, block_k)
    pages = jnp.clip(jnp.where(kv_ok, plgpu.load(table_ref.at[lax.div(pos, page_size)], mask=kv_ok, other=0), 0),
                     0, last_page)
    rows = pages * page_size + lax.rem(pos, page_size) if per_row else pages
    return plgpu.load(ref.at[rows], mask=kv_ok, other=0)


def scale_inputs(k_scale, v_scale, layout: str | None, *, K: int):
    """The scales as the kernels' refs read them (``load_scale_block``): ``head``/``tensor`` as (K, 1),
    ``token`` as (rows, K) (contiguous (B*S, K), paged (P * page_size, K)), ``page`` as (P, K); [] without."""
    if layout is None:
        return []
    out = []
    for s in (k_scale, v_scale):
        s = jnp.asarray(s, jnp.float32)
        if layout in ("head", "tensor"):
            out.append(jnp.broadcast_to(s.reshape(-1, 1), (K, 1)))
        else:
            out.append(s.reshape(-1, K))
    return out


def scale_block_spec(layout: str, shape, bh, rows: int | None = None):
    """The BlockSpec of one scale input (``scale_inputs``' shape) for a grid whose ``bh(*grid ids)`` gives
    (sequence, kv head): per head a (1,) block; per token of a contiguous decode cache (``rows`` = S) the
    sequence's (S,) rows of the head; otherwise all rows of the head (paged, or the serving kernel)."""
    if layout in ("head", "tensor"):
        return pl.BlockSpec((None, 1), lambda *g: (bh(*g)[1], 0))
    if rows is not None:
        return pl.BlockSpec((rows, None), lambda *g: bh(*g))
    return pl.BlockSpec((int(shape[0]), None), lambda *g: (0, bh(*g)[1]))
