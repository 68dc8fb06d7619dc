"""The generic decode path: a decode call (``attnlab.api.decode.DecodeCall``) as masked attention.

``Backend.run_decode``'s default: every backend that has no decode kernel of its own runs a decode call
this way (a backend with a paged path of its own, ``Backend.paged``, reads the pages through the table;
any other runs on the gathered contiguous twin of the cache)."""
from __future__ import annotations

from ..core.spec import prepare


def decode_mask(kv_lengths, q_len: int, max_len: int, *, causal: bool = True, window=None):
    """Bool (B, 1, T, S_max): key s visible to query t at p = kv_lengths[b] - T + t iff s <= p (``causal``,
    the causal tail) and, with ``window`` (left, right), p - left <= s <= p + right (absolute positions)."""
    import jax.numpy as jnp

    lengths = jnp.asarray(kv_lengths, jnp.int32)
    q_pos = (lengths[:, None] - q_len + jnp.arange(q_len)[None, :])[:, :, None]     # (B, T, 1)
    s = jnp.arange(max_len)[None, None, :]
    vis = s <= q_pos if causal else jnp.ones((1, 1, max_len), bool)
    if window is not None:
        vis = vis & (s >= q_pos - window[0]) & (s <= q_pos + window[1])
    return jnp.broadcast_to(vis, (lengths.shape[0], q_len, max_len))[:, None]


def masked_decode(backend, d, scale):
    """``backend.run`` on the decode call ``d`` as masked attention; returns (B, T, N, H) in q's dtype.

    ``scale``: handed to ``prepare`` as given (the caller's argument, None: 1 / sqrt(H); or ``d.scale``)."""
    sp = d.spec
    mask = (decode_mask(d.kv_lengths, sp.q_len, sp.max_len, causal=sp.causal, window=sp.window)
            if sp.needs_mask else None)
    if d.page_table is not None and backend.paged:
        return backend.run_paged_decode(d, mask)
    k, v = d.contiguous()               # a quantized cache: dequantized in float32, and the call runs in float32
    q = d.query
    if getattr(sp, "kv_scale", None) is not None:       # (float64 q: in float64)
        work = "float64" if q.dtype == "float64" else "float32"
        q, k, v = q.astype(work), k.astype(work), v.astype(work)
    p = prepare(q, k, v, None, mask, scale=scale,
                key_value_seq_lengths=d.kv_lengths, logits_soft_cap=sp.soft_cap, sinks=getattr(d, "sinks", None))
    return backend.run(p).reshape(p.out_shape).astype(d.query.dtype)
