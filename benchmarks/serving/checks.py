"""The serving benchmark's checks: float64 truth of the last <= 8 tokens of a batch's longest and shortest
request, judged by the decode tolerance policy (``reference.decode64``), and every row of the output finite."""
from __future__ import annotations

import numpy as np


def references(q, k, v, starts, kv, table, sinks=None, window_left=None, token_scales=None, requests=()):
    """float64 truth of the last <= 8 tokens of the longest and the shortest request (and of ``requests``), with the decode
    tolerance policy's limit for each (computed once per cell, shared by every path); ``sinks`` (N,): the
    call's attention sinks; ``window_left``: the call's sliding window (its left size; None: none);
    ``token_scales`` (k_scale, v_scale) (B, S, K): k, v are a contiguous quantized cache with per-token scales
    (the truth is of its float64 dequantized values)."""
    import jax.numpy as jnp

    from attnlab.kernels.pages import gather_pages
    from attnlab.reference.decode64 import decode_tolerance, reference_decode_attention
    from attnlab.reference.tolerance import rel_l2

    res = []
    for b in sorted({int(np.argmax(kv)), int(np.argmin(kv)), *requests}):
        hi = int(starts[b + 1])
        t = min(8, hi - int(starts[b]))
        n = int(kv[b])
        if table is None:
            kb, vb = k[b:b + 1, :n], v[b:b + 1, :n]
        else:
            kb, vb = (gather_pages(x, table[b:b + 1], jnp.asarray(kv[b:b + 1]))[:, :n] for x in (k, v))
        qb, kb, vb = np.asarray(q[hi - t:hi])[None], np.asarray(kb), np.asarray(vb)
        kw = dict(sinks=sinks, local_window_size=None if window_left is None else (int(window_left), 0))
        if token_scales is not None:
            kw.update(k_scale=np.asarray(token_scales[0][b:b + 1, :n]), v_scale=np.asarray(token_scales[1][b:b + 1, :n]))
        ref = reference_decode_attention(qb, kb, vb, [n], **kw)
        emu = reference_decode_attention(qb, kb, vb, [n], emulate=q.dtype, **kw)
        limit, _ = decode_tolerance(q.dtype, baseline_err=rel_l2(emu, ref))
        res.append((b, slice(hi - t, hi), ref, limit))
    return res


def check(out, refs):
    """One verdict per reference (``references``), then one that every row of ``out`` is finite (NaN never passes,
    wherever it is: the sampled requests are two of many)."""
    from attnlab.reference.tolerance import rel_l2

    finite = bool(np.isfinite(np.asarray(out, np.float32)).all())
    return [dict(request=b, rel_err=(e := rel_l2(np.asarray(out[sl])[None], ref)), limit=limit, ok=bool(e <= limit))
            for b, sl, ref, limit in refs] + [dict(request="every row", finite=finite, ok=finite)]
