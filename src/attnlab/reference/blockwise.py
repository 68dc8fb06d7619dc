"""The whole-output check's reference: attention in float32 on the device, blockwise over query tiles.

Written with plain ``jax.numpy`` einsums, independent of every backend (not ``jax.nn``'s fused path,
not cuDNN), at ``precision=HIGHEST`` (no TF32) and with O(tile · S) memory: ``lax.map`` walks the
query rows in tiles and each tile holds only its (B, K, G, tile, S) scores.

- ``blockwise_attention(q, k, v, ...)`` -> (B, T, N, H) float32 (float64 for float64 inputs).
- ``blockwise_attention(..., emulate=True)`` computes like the fused kernels do: scores of the
  input-dtype operands accumulated in float32, softmax in float32, probabilities rounded to the
  input dtype before P·V, float32 accumulation, output rounded to the input dtype; matmuls at the
  default precision (so TF32 where the device uses it for float32). It is the baseline of the
  tolerance policy (``attnlab.reference.float64``).
- ``blockwise_grads(q, k, v, cotangent, ...)`` -> (dq, dk, dv) of sum(out * cotangent): each query
  tile's contribution is recomputed by ``jax.vjp`` of the tile function and dk, dv are accumulated
  in float32 over tiles (``emulate=True``: the vjp of the kernel-like tile, cast back to the dtype).

Shapes: q (B, T, N, H); k, v (B, S, K, H), K divides N (query head n reads key/value head
n // (N // K)). Visibility of key s to query row t of batch element b, at position
pos = q_positions[b, t] (default t): s < kv_lengths[b] when given; with ``causal`` s <= pos; with
``window=(left, right)`` pos - left <= s <= pos + right. Rows with no visible key give 0 (jax.nn
gives the mean of V there: the checks accept either, ``attnlab.reference.rules``; ``empty_rows`` finds
them); rows t >= q_lengths[b] (when given) give 0, as jax.nn does.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from ..core.masking import large_negative
from .compiled import STATIC

#: bytes one tile's float32 scores may take, by platform (the backward pass holds a few of them)
TILE_BUDGET = {"gpu": 256 * 2**20, "cpu": 16 * 2**20}


def tile_rows(B: int, T: int, N: int, S: int, budget: int | None = None) -> int:
    """Query rows per tile so that one tile's (B, N, rows, S) float32 scores fit ``budget`` bytes."""
    if budget is None:
        budget = TILE_BUDGET.get(jax.default_backend(), TILE_BUDGET["cpu"])
    rows = max(1, budget // max(1, B * N * S * 4))
    if rows >= T:
        return T
    return rows // 8 * 8 if rows >= 8 else rows


def _acc(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def _visible(pos, S, kv_lengths, causal, window, q_seg=None, kv_seg=None):
    """(B, R, S) bool: key s is visible to the query row at ``pos`` (B, R) (see the module doc)."""
    key = jnp.arange(S)[None, None, :]
    p_ = pos[:, :, None]
    vis = jnp.ones(p_.shape[:2] + (S,), bool)
    if kv_lengths is not None:
        vis &= key < kv_lengths[:, None, None]
    if causal:
        vis &= key <= p_
    if window is not None:
        vis &= (key >= p_ - window[0]) & (key <= p_ + window[1])
    if q_seg is not None:
        vis &= (q_seg[:, :, None] == kv_seg[:, None, :]) & (kv_seg[:, None, :] >= 0)
    return vis


def _tile(qt, pos, k, v, kv_lengths, *, scale, causal, window, emulate, soft_cap=None, q_seg=None, kv_seg=None,
          sinks=None):
    """One query tile: qt (B, R, K, G, H), pos (B, R) -> (B, R, K, G, H); q_seg (B, R) and kv_seg (B, S)
    segment ids or None; sinks (N,) or None: one more logit per query head in the denominator, no value."""
    S = k.shape[1]
    acc = _acc(qt.dtype)
    if emulate:
        prec = None
    else:
        prec = jax.lax.Precision.HIGHEST
        qt, k, v = qt.astype(acc), k.astype(acc), v.astype(acc)
    s = jnp.einsum("brkgh,bskh->bkgrs", qt, k, preferred_element_type=acc, precision=prec) * scale
    if soft_cap is not None:
        s = soft_cap * jnp.tanh(s / soft_cap)
    vis = _visible(pos, S, kv_lengths, causal, window, q_seg, kv_seg)[:, None, None]   # (B, 1, 1, R, S)
    s = jnp.where(vis, s, large_negative(acc))                 # finite, as jax.nn (attnlab.core.masking)
    m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    sink = None if sinks is None else jnp.asarray(sinks).astype(acc).reshape(1, k.shape[2], -1, 1, 1)
    if sink is not None:
        m = jnp.maximum(m, sink)
    w = jnp.where(vis, jnp.exp(s - m), 0.0)
    denom = jnp.sum(w, axis=-1, keepdims=True) + (0.0 if sink is None else jnp.exp(sink - m))
    p = w / jnp.where(denom == 0, 1.0, denom)
    if emulate:
        p = p.astype(qt.dtype)    # the query's dtype: a dequantized float32 cache's kernel rounds P to it too
    o = jnp.einsum("bkgrs,bskh->brkgh", p, v, preferred_element_type=acc, precision=prec)
    if q_seg is not None:                                      # padding rows (id < 0) give 0
        o = jnp.where((q_seg >= 0)[:, :, None, None, None], o, 0.0)
    return o.astype(qt.dtype) if emulate else o


def _tiles(x, R: int, n: int):
    """(B, T, ...) -> (n, B, R, ...), padding T up to n * R with zeros."""
    B, T = x.shape[:2]
    pad = n * R - T
    if pad:
        x = jnp.concatenate([x, jnp.zeros((B, pad) + x.shape[2:], x.dtype)], axis=1)
    return jnp.moveaxis(x.reshape((B, n, R) + x.shape[2:]), 1, 0)


def _untile(x, T: int):
    """(n, B, R, ...) -> (B, T, ...)."""
    n, B, R = x.shape[:3]
    return jnp.moveaxis(x, 0, 1).reshape((B, n * R) + x.shape[3:])[:, :T]


def _prepare(q, k, v, q_positions, kv_lengths, tile, budget):
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    if N % K:
        raise ValueError(f"query heads N={N} must be a multiple of key/value heads K={K}")
    R = tile or tile_rows(B, T, N, S, budget)
    n = math.ceil(T / R)
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None] if q_positions is None
                           else jnp.asarray(q_positions, jnp.int32).reshape(-1, T), (B, T))
    lens = None if kv_lengths is None else jnp.asarray(kv_lengths, jnp.int32)
    qg = q.reshape(B, T, K, N // K, H)
    return B, T, N, H, K, R, n, qg, pos, lens


def _zero_rows(out, q_lengths):
    if q_lengths is None:
        return out
    T = out.shape[1]
    keep = jnp.arange(T)[None, :] < jnp.asarray(q_lengths, jnp.int32)[:, None]
    return jnp.where(keep[:, :, None, None], out, 0).astype(out.dtype)


def _segs(q_segments, kv_segments, B, T, R, n):
    """(query ids as tiles (n, B, R), key ids (B, S)) or (None, None); padded tile rows get id -1."""
    if q_segments is None:
        return None, None
    qs = jnp.asarray(q_segments, jnp.int32).reshape(B, T)
    pad = n * R - T
    if pad:
        qs = jnp.concatenate([qs, jnp.full((B, pad), -1, jnp.int32)], axis=1)
    return jnp.moveaxis(qs.reshape(B, n, R), 1, 0), jnp.asarray(kv_segments, jnp.int32)


@functools.partial(jax.jit, static_argnames=("causal", "window", "emulate", "tile", "budget", "soft_cap"))
def blockwise_attention(q, k, v, *, scale=None, causal=False, window=None, kv_lengths=None, q_positions=None,
                        q_lengths=None, emulate=False, tile=None, budget=None, soft_cap=None, q_segments=None,
                        kv_segments=None, sinks=None):
    """Attention output (B, T, N, H): float32 reference, or the kernel-like emulation (see module doc).
    ``soft_cap``: logits -> cap * tanh(logits / cap) before masking; ``q_segments`` (B, T) and
    ``kv_segments`` (B, S): packed segment ids (equal ids see each other; id < 0: padding, row 0); ``sinks``
    (N,): attention sinks, one more logit per query head in each row's denominator, with no value."""
    B, T, N, H, K, R, n, qg, pos, lens = _prepare(q, k, v, q_positions, kv_lengths, tile, budget)
    scale = 1.0 / math.sqrt(H) if scale is None else scale
    qseg, kvseg = _segs(q_segments, kv_segments, B, T, R, n)
    fn = functools.partial(_tile, k=k, v=v, kv_lengths=lens, scale=scale, causal=causal,
                           window=None if window is None else tuple(window), emulate=emulate, soft_cap=soft_cap,
                           kv_seg=kvseg, sinks=sinks)
    if qseg is None:
        out = jax.lax.map(lambda xs: fn(xs[0], xs[1]), (_tiles(qg, R, n), _tiles(pos, R, n)))
    else:
        out = jax.lax.map(lambda xs: fn(xs[0], xs[1], q_seg=xs[2]), (_tiles(qg, R, n), _tiles(pos, R, n), qseg))
    return _zero_rows(_untile(out, T).reshape(B, T, N, H), q_lengths)


@functools.partial(jax.jit, static_argnames=("causal", "window", "emulate", "tile", "budget", "soft_cap"))
def blockwise_grads(q, k, v, cotangent, *, scale=None, causal=False, window=None, kv_lengths=None,
                    q_positions=None, q_lengths=None, emulate=False, tile=None, budget=None, soft_cap=None,
                    q_segments=None, kv_segments=None, sinks=None):
    """(dq, dk, dv) of sum(out * cotangent): float32 (q's dtype with ``emulate``), per-tile vjp."""
    B, T, N, H, K, R, n, qg, pos, lens = _prepare(q, k, v, q_positions, kv_lengths, tile, budget)
    qseg, kvseg = _segs(q_segments, kv_segments, B, T, R, n)
    if qseg is None:
        qseg = jnp.zeros((n, 0), jnp.int32)      # a scanned placeholder: no segments
    scale = 1.0 / math.sqrt(H) if scale is None else scale
    acc = _acc(q.dtype)
    ct = _zero_rows(jnp.asarray(cotangent).astype(q.dtype if emulate else acc), q_lengths)
    ctg = ct.reshape(B, T, K, N // K, H)
    win = None if window is None else tuple(window)

    def body(carry, xs):
        dk, dv = carry
        qt, pt, ctt, st = xs
        f = functools.partial(_tile, pos=pt, kv_lengths=lens, scale=scale, causal=causal, window=win, emulate=emulate,
                              soft_cap=soft_cap, q_seg=None if kvseg is None else st, kv_seg=kvseg, sinks=sinks)
        _, vjp = jax.vjp(lambda a, b, c: f(a, k=b, v=c), qt, k, v)
        dqt, dkt, dvt = vjp(ctt)
        return (dk + dkt.astype(acc), dv + dvt.astype(acc)), dqt

    zeros = jnp.zeros(k.shape, acc)
    (dk, dv), dq = jax.lax.scan(body, (zeros, zeros), (_tiles(qg, R, n), _tiles(pos, R, n), _tiles(ctg, R, n), qseg))
    dq = _untile(dq, T).reshape(B, T, N, H)
    out_dtype = q.dtype if emulate else acc
    return dq.astype(out_dtype), dk.astype(out_dtype), dv.astype(out_dtype)


@functools.partial(jax.jit, static_argnames=STATIC)
def empty_rows(q, k, *, causal=False, window=None, kv_lengths=None, q_positions=None, q_lengths=None, tile=None,
               budget=None, q_segments=None, kv_segments=None, soft_cap=None, **_):
    """(B, T) bool: the query rows that see no key (padded rows, t >= q_lengths[b] or a negative segment
    id, excluded: they are 0 by rule), a tile of rows at a time; ``blockwise_attention``'s arguments."""
    B, T, N, H, K, R, n, qg, pos, lens = _prepare(q, k, k, q_positions, kv_lengths, tile, budget)
    qseg, kvseg = _segs(q_segments, kv_segments, B, T, R, n)
    win = None if window is None else tuple(window)
    see = lambda p_, qs: jnp.any(_visible(p_, k.shape[1], lens, causal, win, qs, kvseg), axis=-1)  # noqa: E731
    if qseg is None:
        seen = jax.lax.map(lambda p_: see(p_, None), _tiles(pos, R, n))
    else:
        seen = jax.lax.map(lambda xs: see(xs[0], xs[1]) | (xs[1] < 0), (_tiles(pos, R, n), qseg))
    empty = ~_untile(seen, T)
    if q_lengths is not None:
        empty &= jnp.arange(T)[None, :] < jnp.asarray(q_lengths, jnp.int32)[:, None]
    return empty
