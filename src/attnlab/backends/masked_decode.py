"""The generic decode path: a decode call (an ``attnlab.core.call.Call`` of kind decode) as masked attention.

``Backend.run_decode``'s default: every backend that has no decode kernel of its own runs a decode call
this way (a backend with a paged path of its own, ``Backend.paged``, reads the pages through the table;
any other runs on the gathered contiguous twin of the cache)."""
from __future__ import annotations

import jax.numpy as jnp

from ..core.kv_quant import dequantize
from ..core.prepare import prepare
from ..kernels.pages import gather_pages


def decode_mask(kv_lengths, q_len: int, max_len: int, *, causal: bool = True, window=None):
    """Bool (B, 1, T, S_max): key s visible to query t at p = kv_lengths[b] - T + t iff s <= p (``causal``,
    the causal tail) and, with ``window`` (left, right), p - left <= s <= p + right (absolute positions)."""
    lengths = jnp.asarray(kv_lengths, jnp.int32)
    q_pos = (lengths[:, None] - q_len + jnp.arange(q_len)[None, :])[:, :, None]     # (B, T, 1)
    s = jnp.arange(max_len)[None, None, :]
    vis = s <= q_pos if causal else jnp.ones((1, 1, max_len), bool)
    if window is not None:
        vis = vis & (s >= q_pos - window[0]) & (s <= q_pos + window[1])
    return jnp.broadcast_to(vis, (lengths.shape[0], q_len, max_len))[:, None]


def contiguous_kv(call, q_dtype):
    """(k, v) of a decode or serving call as contiguous float caches (B, S_max, K, H): the pages gathered
    through the table, a quantized cache dequantized in float32, or float64 for a float64 ``q_dtype``
    (``core.kv_quant.dequantize``)."""
    k, v = call.key, call.value
    if call.problem is not None and call.kv_scale is not None:
        work = "float64" if q_dtype == jnp.float64 else "float32"
        k, v = (dequantize(c, s, call.kv_scale, work, jnp) for c, s in ((k, call.k_scale), (v, call.v_scale)))
    if call.page_table is None:
        return k, v

    return gather_pages(k, call.page_table, call.kv_lengths), gather_pages(v, call.page_table, call.kv_lengths)


def masked_decode(backend, d, scale):
    """``backend.run`` on the decode call ``d`` as masked attention; returns (B, T, N, H) in q's dtype.

    ``scale``: handed to ``prepare`` as given (the caller's argument, None: 1 / sqrt(H); or ``d.scale``)."""
    mask = (decode_mask(d.kv_lengths, d.q_len, d.max_len, causal=d.causal, window=d.window)
            if d.needs_mask else None)
    if d.page_table is not None and backend.paged:
        return backend.run_paged_decode(d, mask)
    k, v = contiguous_kv(d, d.query.dtype)   # a quantized cache: dequantized in float32 (float64 q: float64)
    # V past each length is 0 here: a softmax weight of 0 times a NaN left in the cache's padding would be NaN
    v = jnp.where((jnp.arange(v.shape[1]) < d.kv_lengths[:, None])[:, :, None, None], v, jnp.zeros((), v.dtype))
    q = d.query
    if d.kv_scale is not None:       # (float64 q: in float64)
        work = "float64" if q.dtype == "float64" else "float32"
        q, k, v = q.astype(work), k.astype(work), v.astype(work)
    p = prepare(q, k, v, None, mask, scale=scale,
                key_value_seq_lengths=d.kv_lengths, logits_soft_cap=d.soft_cap, sinks=d.sinks)
    return backend.run(p).reshape(p.out_shape).astype(d.query.dtype)
