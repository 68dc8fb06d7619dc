"""The truth for a serving call (``attnlab.serving_attention``): NumPy float64, request by request.

q (T_total, N, H) packs the new tokens of B requests; q_starts (B+1,) their cumulative starts;
kv_lengths (B,) each request's cached tokens *including* its new ones; caches (B, S_max, K, H)
(a paged cache is judged through its gathered twin, ``attnlab.kernels.pages.gather_pages``).
Query i of request b sits at position kv_lengths[b] - q_len[b] + i and sees the keys at positions
<= its own; with ``local_window_size`` (w, read as (w, w), or (left, right)) only those >= its position
- left (the call is causal: right changes nothing). Tokens at >= q_starts[B] are padding: their output rows are 0.
``kernel_like_serving`` is the same call as a kernel computes it in a low-precision dtype (the check's emulation).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.checks import check_soft_cap
from .decode64 import dequantized64


def reference_serving_attention(q, k_cache, v_cache, q_starts, kv_lengths, *, scale=None, logits_soft_cap=None,
                                requests=None, sinks=None, local_window_size=None, k_scale=None,
                                v_scale=None) -> np.ndarray:
    """Float64 (T_total, N, H) output of a serving call (see the module docstring).
    ``sinks`` (N,): one more logit per query head in the softmax denominator, with no value.
    ``k_scale``/``v_scale``: a quantized contiguous cache's scales; dequantized in float64 first
    (``attnlab.reference.decode64.dequantized64``).

    ``requests``: the request indices to compute (default all); the rows of the others stay 0, so
    a check of a long batch can sample its longest and shortest requests only."""
    q = np.asarray(q).astype(np.float64)
    k, v = dequantized64(k_cache, v_cache, k_scale, v_scale)
    starts = np.asarray(q_starts).astype(np.int64)
    lengths = np.asarray(kv_lengths).astype(np.int64)
    T_total, N, H = q.shape
    B, S, K, _ = k.shape
    if starts.shape != (B + 1,) or lengths.shape != (B,):
        raise ValueError(f"q_starts must be (B+1,)=({B + 1},) and kv_lengths (B,)=({B},), "
                         f"got {starts.shape} and {lengths.shape}")
    G = N // K
    sc = 1.0 / math.sqrt(H) if scale is None else float(scale)
    cap = check_soft_cap(logits_soft_cap)
    out = np.zeros((T_total, N, H))
    for b in range(B) if requests is None else requests:
        lo, hi, n = int(starts[b]), int(starts[b + 1]), int(lengths[b])
        t = hi - lo
        if t <= 0:
            continue
        qb = q[lo:hi].reshape(t, K, G, H)
        logits = np.einsum("tkgh,skh->kgts", qb, k[b, :n]) * sc
        if cap is not None:
            logits = cap * np.tanh(logits / cap)
        pos = n - t + np.arange(t)
        vis = np.arange(n)[None, :] <= pos[:, None]                      # (t, n)
        if local_window_size is not None:
            left = int(local_window_size if np.ndim(local_window_size) == 0 else local_window_size[0])
            vis &= np.arange(n)[None, :] >= pos[:, None] - left
        logits = np.where(vis, logits, -np.inf)
        m = logits.max(axis=-1, keepdims=True)
        sink = None if sinks is None else np.asarray(sinks, np.float64).reshape(K, G, 1, 1)
        m = m if sink is None else np.maximum(m, sink)
        w = np.exp(logits - m)
        w = w / (w.sum(axis=-1, keepdims=True) + (0.0 if sink is None else np.exp(sink - m)))
        out[lo:hi] = np.einsum("kgts,skh->tkgh", w, v[b, :n]).reshape(t, N, H)
    return out


def kernel_like_serving(q, k, v, q_starts, kv_lengths, dtype: str, soft_cap=None, local_window_size=None,
                sinks=None) -> np.ndarray:
    """What a serving kernel computes in ``dtype`` for the same call (the check's emulation, float64 (T_total, N, H)):
    float32 scores, P rounded to ``dtype``, float32 sums (the sinks' exp(sink - max) in the denominator), the
    output rounded. ``local_window_size``: (left, right), causal."""
    q, k, v = (np.asarray(x).astype(np.float32) for x in (q, k, v))
    T_total, N, H = q.shape
    K = k.shape[2]
    out = np.zeros(q.shape, np.float32)
    for b in range(len(kv_lengths)):
        lo, hi, n = int(q_starts[b]), int(q_starts[b + 1]), int(kv_lengths[b])
        qb = q[lo:hi].reshape(hi - lo, K, N // K, H)
        s = np.einsum("tkgh,skh->kgts", qb, k[b, :n]) / np.float32(math.sqrt(H))
        if soft_cap is not None:
            s = np.float32(soft_cap) * np.tanh(s / np.float32(soft_cap))
        pos = (n - (hi - lo) + np.arange(hi - lo))[:, None]
        vis = np.arange(n)[None, :] <= pos
        if local_window_size is not None:
            vis &= np.arange(n)[None, :] >= pos - local_window_size[0]
        s = np.where(vis, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        sink = None if sinks is None else np.asarray(sinks, np.float32).reshape(K, N // K, 1, 1)
        m = m if sink is None else np.maximum(m, sink)
        w = np.exp(s - m)
        denom = w.sum(axis=-1) + (0 if sink is None else np.exp(sink - m)[..., 0])
        pv = np.einsum("kgts,skh->tkgh", w.astype(dtype).astype(np.float32), v[b, :n])
        out[lo:hi] = (pv / np.moveaxis(denom, -1, 0)[..., None]).reshape(hi - lo, N, H)
    return out.astype(dtype).astype(np.float64)
