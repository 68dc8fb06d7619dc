"""Packed sequences on cuDNN: segment ids -> JAX's private packed-segment entry point.

``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention(q, k, v, None, None, q_seqlen,
kv_seqlen, q_offsets, kv_offsets, ...)`` takes, per batch row, up to M segments: ``q_offsets``
(B, M + 1) the first token of each segment (-1 for none), ``q_seqlen`` (B, M) its length (-1 for
none), the same for the keys; query segment j attends key segment j only. jax.nn does not expose it.

``layout(ids, M)`` turns contiguous segment ids into that form on the device (jit-safe, M static).
A segment is a run of one id >= 0; query segment j pairs with key segment j, so the call is exact when

- every row's segments are contiguous (an id never comes back after another one started),
- the query and key rows list the same ids in the same order,
- with ``is_causal`` or a window: the query and key segments start and end at the same tokens
  (cuDNN's causal mask and window count positions from each segment's start).

Concrete ids that break a rule are refused before the call (``UnsupportedError`` with the rule);
traced ids cannot be, so a row that breaks one gives NaN (which never passes a check).
Padding tokens (id < 0) are in no segment: their output rows, and their gradients, are 0.
M is the most segments of a row when the ids are concrete (rounded up to a power of two, so a few
programs serve many packings), else min(T, S).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..core import segments
from ..core.errors import UnsupportedError
from ..core.call import Call
from ..kernels.decode_plan import next_pow2


def refusal(spec: Call) -> str | None:
    """Why the packed path cannot run ``spec`` (its static facts), or None."""
    if spec.bias_shape or spec.mask_shape:
        return "segment ids with bias or mask: the packed entry point is called without them here"
    if spec.return_residual:
        return "segment ids with return_residual: the packed path returns no residual here"
    if spec.kv_heads != spec.heads:
        # _fix_seqlen_offsets multiplies kv_offsets by the *query* heads N * H. The forward measured right
        # with K < N on the H200 (results/gpu-2026-12-04-packed); gradients are not checked yet.
        return (f"segment ids with GQA (K={spec.kv_heads} < N={spec.heads}): JAX's packed path strides key "
                "offsets by the query heads (N * H); not validated for K < N (gradients unchecked)")
    if spec.segments_contiguous is False:
        return "segment ids are not contiguous (an id comes back after another started): cuDNN packs runs"
    if spec.window is not None and spec.window[1] != 0:
        return "segment ids with a window reaching right: cuDNN's window is left-only"
    if spec.window is not None and not spec.is_causal:
        return "segment ids with a window needs is_causal (cuDNN's sliding window is causal)"
    if spec.has_q_lengths or spec.has_kv_lengths:
        # folded into the ids one side at a time, a segment cut by one side's length no longer pairs with the other's
        return "segment ids with query_seq_lengths or key_value_seq_lengths: give the padding as negative ids"
    ids = (spec.q_segment_ids, spec.kv_segment_ids)
    if all(hasattr(x, "__array__") and not isinstance(x, jax.core.Tracer) for x in ids):   # concrete: the run's rules
        try:
            check_concrete(*ids, spec.is_causal or spec.window is not None)
        except UnsupportedError as e:
            return e.reason
    return None


def layout(ids, M: int):
    """(offsets (B, M+1), lengths (B, M), ids of segment starts (B, M), segment count (B,)) of (B, L) ids;
    entries past a row's segments are -1. Rows with more than M segments are cut (the caller flags them)."""
    ids = jnp.asarray(ids, jnp.int32)
    B, L = ids.shape
    prev = jnp.concatenate([jnp.full((B, 1), jnp.iinfo(jnp.int32).min, jnp.int32), ids[:, :-1]], axis=1)
    start = (ids >= 0) & (ids != prev)
    offs = jax.vmap(lambda s: jnp.nonzero(s, size=M, fill_value=-1)[0])(start).astype(jnp.int32)
    count = jnp.sum(start, axis=1, dtype=jnp.int32)
    index = jnp.where(ids >= 0, jnp.cumsum(start, axis=1, dtype=jnp.int32) - 1, M)
    lens = jax.vmap(lambda i: jnp.zeros((M,), jnp.int32).at[i].add(1, mode="drop"))(index)
    has = jnp.arange(M)[None, :] < count[:, None]
    lens = jnp.where(has, lens, -1)
    start_ids = jnp.where(has, jnp.take_along_axis(ids, jnp.maximum(offs, 0), axis=1), -1)
    offsets = jnp.concatenate([offs, jnp.full((B, 1), -1, jnp.int32)], axis=1)
    return offsets, lens, start_ids, count


def _distinct(x, count):
    """(B,) bool: the first ``count`` entries of each row of x are pairwise distinct."""
    M = x.shape[1]
    filler = -2 - jnp.arange(M, dtype=x.dtype)[None, :]          # distinct, below every id
    y = jnp.sort(jnp.where(jnp.arange(M)[None, :] < count[:, None], x, filler), axis=1)
    return jnp.all(y[:, 1:] != y[:, :-1], axis=1)


def check_concrete(q_ids, kv_ids, aligned: bool) -> None:
    """Refuse concrete ids the packed call would get wrong (``UnsupportedError`` naming the rule)."""
    if isinstance(q_ids, jax.core.Tracer) or isinstance(kv_ids, jax.core.Tracer):
        return
    q, kv = np.asarray(q_ids), np.asarray(kv_ids)
    for b in range(q.shape[0]):
        sq, sk = segments.starts(q[b]), segments.starts(kv[b])
        if q[b][sq].tolist() != kv[b][sk].tolist():
            raise UnsupportedError("cudnn", f"segment ids of row {b}: query segments {q[b][sq].tolist()} and key "
                                            f"segments {kv[b][sk].tolist()} differ (cuDNN pairs segment j with j)")
        if aligned and (q.shape[1] != kv.shape[1] or not np.array_equal(np.where(q[b] >= 0, q[b], -1),
                                                                        np.where(kv[b] >= 0, kv[b], -1))):
            raise UnsupportedError("cudnn", f"segment ids of row {b}: with is_causal or a window the query and key "
                                            "segments must cover the same tokens (cuDNN counts positions per segment)")


def run(p: Call):
    """The packed cuDNN call on normalised inputs (``refusal`` already None); returns (B, T, N, H)."""
    from jax._src.cudnn import fused_attention_stablehlo as fa  # JAX-private: may move

    T, S = p.q_len, p.kv_len
    aligned = p.is_causal or p.window is not None
    q_ids, kv_ids = (jnp.asarray(x, jnp.int32) for x in (p.q_segment_ids, p.kv_segment_ids))
    check_concrete(p.q_segment_ids, p.kv_segment_ids, aligned)
    M = min(next_pow2(p.max_segments or 1), min(T, S)) if p.max_segments is not None else min(T, S)
    q_off, q_len, q_start, q_n = layout(q_ids, M)
    kv_off, kv_len, kv_start, kv_n = layout(kv_ids, M)
    ok = (q_n <= M) & (kv_n <= M) & (q_n == kv_n) & jnp.all(q_start == kv_start, axis=1)
    ok &= _distinct(q_start, q_n) & _distinct(kv_start, kv_n)
    if aligned:
        ok &= jnp.all(q_off == kv_off, axis=1) & jnp.all(q_len == kv_len, axis=1)
    q_keep, kv_keep = q_ids >= 0, kv_ids >= 0
    # zeroing padding tokens' inputs also zeroes their gradients (cuDNN leaves those rows undefined)
    zero = lambda x, keep: jnp.where(keep[:, :, None, None], x, jnp.zeros((), x.dtype))  # noqa: E731
    q, k, v = zero(p.query, q_keep), zero(p.key, kv_keep), zero(p.value, kv_keep)
    mask_type = fa.MaskType.CAUSAL if p.is_causal else fa.MaskType.NO_MASK
    window = None if p.window is None else p.window[0] + 1
    out = fa.dot_product_attention(q, k, v, None, None, q_len, kv_len, q_off, kv_off, scale=p.scale,
                                   mask_type=mask_type, sliding_window_length=window)
    out = jnp.where(q_keep[:, :, None, None], out, jnp.zeros((), out.dtype))
    return jnp.where(ok[:, None, None, None], out, jnp.full((), jnp.nan, out.dtype))
