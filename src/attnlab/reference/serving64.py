"""The truth for a serving call (``attnlab.serving_attention``): NumPy float64, request by request.

q (T_total, N, H) packs the new tokens of B requests; q_starts (B+1,) their cumulative starts;
kv_lengths (B,) each request's cached tokens *including* its new ones; caches (B, S_max, K, H)
(a paged cache is judged through its gathered twin, ``attnlab.kernels.pages.gather_pages``).
Query i of request b sits at position kv_lengths[b] - q_len[b] + i and sees the keys at positions
<= its own; with ``local_window_size`` (w, read as (w, w), or (left, right)) only those >= its position
- left (the call is causal: right changes nothing). Tokens at >= q_starts[B] are padding: their output rows are 0.
``kernel_like_serving`` is the same call as a kernel computes it in a low-precision dtype (the check's emulation).

``serving_errors`` is the reference side of a serving cell's check (``attnlab.measure.check``): the first and last
``EDGE`` tokens of the longest and shortest requests (``sampled``) against float64 and the emulation's errors on the
same rows (the tolerance policy's baselines).
"""
from __future__ import annotations

import math

import numpy as np

from ..core import request_lengths as rl
from ..core.checks import check_serving_lengths, check_soft_cap, length_values
from .decode64 import dequantized64
from .tolerance import rel_l2, row_rel_err

#: Tokens checked at each end of a sampled request (all of a request of at most 2 * EDGE tokens).
EDGE = 8


def reference_serving_attention(q, k_cache, v_cache, q_starts, kv_lengths, *, scale=None, logits_soft_cap=None,
                                requests=None, sinks=None, local_window_size=None, k_scale=None,
                                v_scale=None) -> np.ndarray:
    """Float64 (T_total, N, H) output of a serving call (see the module docstring).
    ``sinks`` (N,): one more logit per query head in the softmax denominator, with no value.
    ``k_scale``/``v_scale``: a quantized contiguous cache's scales; dequantized in float64 first
    (``attnlab.reference.decode64.dequantized64``).

    ``requests``: the request indices to compute (default all); the rows of the others stay 0, so
    a check of a long batch can sample its longest and shortest requests only."""
    k, v = dequantized64(k_cache, v_cache, k_scale, v_scale)
    B = k.shape[0]
    starts, lengths = (length_values(name, np.asarray(x), n, size) for name, x, n, size in
                       (("q_starts", q_starts, B + 1, "B+1"), ("kv_lengths", kv_lengths, B, "B")))
    check_serving_lengths(starts, lengths, np.shape(q)[0], k.shape[1])
    starts, lengths = starts.astype(np.int64), lengths.astype(np.int64)
    return _attention64(q, k, v, starts, lengths, scale=scale, logits_soft_cap=logits_soft_cap, requests=requests,
                        sinks=sinks, local_window_size=local_window_size)


def _attention64(q, k, v, starts, lengths, *, scale=None, logits_soft_cap=None, requests=None, sinks=None,
                 local_window_size=None) -> np.ndarray:
    """``reference_serving_attention`` of float64 caches k, v (B, S_max, K, H) and int64 ``starts``/``lengths``."""
    q = np.asarray(q).astype(np.float64)
    T_total, N, H = q.shape
    B, S, K, _ = k.shape
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
        if hi == lo:
            continue        # an idle slot
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


def sampled(q_lens, kv_lens) -> list[tuple[int, int, int, int]]:
    """(request, first query row in the packed q, tokens, KV length) of each sampled piece: the first and last
    ``EDGE`` tokens of the longest and shortest requests by KV and by query length (the first tokens of a
    request see the keys before them: a request of their own with a shorter KV length)."""
    starts = rl.starts_of(q_lens)
    live = np.flatnonzero(np.asarray(q_lens) > 0)      # idle slots (no tokens) have no rows to check
    kv_live, q_live = np.asarray(kv_lens)[live], np.asarray(q_lens)[live]
    picks = sorted({int(live[i]) for i in (np.argmax(kv_live), np.argmin(kv_live), np.argmax(q_live), np.argmin(q_live))}
                   if live.size else ())
    out = []
    for r in picks:
        t, n, s0 = int(q_lens[r]), int(kv_lens[r]), int(starts[r])
        if t <= 2 * EDGE:
            out.append((r, s0, t, n))
        else:
            out += [(r, s0, EDGE, n - t + EDGE), (r, s0 + t - EDGE, EDGE, n)]
    return out


def sampled_requests(q_lens, kv_lens) -> list[int]:
    """The requests ``sampled`` pieces come from, in order (a quantized cache's check dequantizes these)."""
    return sorted({r for r, *_ in sampled(q_lens, kv_lens)})


def serving_errors(out, q, k, v, q_lens, kv_lens, dtype: str, *, logits_soft_cap=None, local_window_size=None,
                   sinks=None, dequantized=None) -> dict:
    """The errors of a serving step's output ``out`` (T_total, N, H) on its ``sampled`` rows, of the contiguous
    inputs q (T_total, N, H), k, v (B, S_max, K, H) and lengths ``q_lens``, ``kv_lens`` (B,), against float64:
    {"rel_err", "row_err" (inf when ``out`` has NaN or Inf there), "baseline", "row_baseline" (the emulation in
    ``dtype``, ``kernel_like_serving``, on the same rows), "max_abs_err", "requests" (``sampled_requests``),
    "rows" (sampled rows), "fraction" (of all rows), "kv_rel_err" (None unless ``dequantized``)}. ``dequantized``:
    a quantized cache's (k, v) of the ``sampled_requests`` in order (each (len, S_max, K, H) float64): the truth
    is then computed on them, and ``kv_rel_err`` is the output's error against float64 of the unquantized k, v."""
    pieces = sampled(q_lens, kv_lens)
    rows = np.concatenate([np.arange(s0, s0 + t) for _, s0, t, _ in pieces])
    reqs, n_max = [r for r, *_ in pieces], max(n for *_, n in pieces)
    kv = [np.asarray(x[np.asarray(reqs), :n_max]).astype(np.float64) for x in (k, v)]
    unquantized = kv
    if dequantized is not None:   # each sampled request's dequantized once, then its sampled pieces'
        back = np.unique(reqs, return_inverse=True)[1]      # the index of each piece's request in sampled_requests
        kv = [x[:, :n_max][back] for x in dequantized]
    qs = np.asarray(q[rows])
    starts, lengths = rl.starts_of([t for _, _, t, _ in pieces]).astype(np.int64), np.asarray([n for *_, n in pieces])
    sem = dict(logits_soft_cap=logits_soft_cap, sinks=sinks, local_window_size=local_window_size)
    ref = _attention64(qs, *kv, starts, lengths, **sem)
    emul = kernel_like_serving(qs, *kv, starts, lengths, dtype, logits_soft_cap, local_window_size, sinks)
    got = np.asarray(out[rows]).astype(np.float64)
    finite = np.all(np.isfinite(got))
    return {"rel_err": rel_l2(got, ref), "row_err": row_rel_err(got, ref, 1) if finite else math.inf,
            "baseline": rel_l2(emul, ref), "row_baseline": row_rel_err(emul, ref, 1),
            "max_abs_err": float(np.max(np.abs(got - ref))), "requests": sorted(set(reqs)), "rows": int(rows.size),
            "fraction": int(rows.size) / int(np.sum(q_lens)),
            "kv_rel_err": None if dequantized is None else rel_l2(got, _attention64(qs, *unquantized, starts, lengths,
                                                                                     **sem))}
