"""The generic serving path: a serving call (a serving ``Call``) as masked attention in jax.numpy.

Each token finds its request (``searchsorted`` on q_starts), gathers that request's cache rows and
attends them under the position mask ``s <= kv_len - q_len + i`` (and ``s < kv_len``); padding tokens
(at >= q_starts[B]) give 0. It runs wherever XLA does (the CPU included) and works with traced
lengths and a traced scale. Memory: the gathered keys and values, O(T_total x S_max x K x H) per
chunk of tokens: a correctness path and a peer for decode batches, not for long prefill chunks.
"""
from __future__ import annotations
import jax
import jax.numpy as jnp


def request_of_tokens(q_starts, total_tokens: int):
    """(T_total,) int32 request index of each token (B for padding tokens) and its index inside the request."""
    starts = jnp.asarray(q_starts, jnp.int32)
    t = jnp.arange(total_tokens, dtype=jnp.int32)
    req = jnp.searchsorted(starts[1:], t, side="right").astype(jnp.int32)
    return req, t - starts[jnp.minimum(req, starts.shape[0] - 2)]


def masked_serving(q, k_cache, v_cache, q_starts, kv_lengths, *, scale, soft_cap=None, sinks=None, window=None):
    """(T_total, N, H) in q's dtype from q (T_total, N, H) and contiguous caches (B, S, K, H), float32 inside
    (float64 for float64 q: a float64 call is float64-accurate).
    ``sinks`` (N,): one more logit per query head in the softmax, with no value (attention sinks).
    ``window`` (left, right): a token at position p also needs s >= p - left (right: no effect, causal)."""
    T_total, N, H = q.shape
    B, S, K, _ = k_cache.shape
    G = N // K
    req, i = request_of_tokens(q_starts, T_total)
    pad = req >= B
    r = jnp.minimum(req, B - 1)
    starts = jnp.asarray(q_starts, jnp.int32)
    kv = jnp.asarray(kv_lengths, jnp.int32)[r]
    pos = kv - (starts[r + 1] - starts[r]) + i                               # (T,)
    vis = (jnp.arange(S)[None, :] <= pos[:, None]) & (jnp.arange(S)[None, :] < kv[:, None])
    if window is not None:
        vis = vis & (jnp.arange(S)[None, :] >= pos[:, None] - window[0])
    work = jnp.promote_types(q.dtype, jnp.float32)
    qg = q.astype(work).reshape(T_total, K, G, H)
    k = jnp.asarray(k_cache, work)[r]                                  # (T, S, K, H)
    logits = jnp.einsum("tkgh,tskh->tkgs", qg, k) * scale
    if soft_cap is not None:
        logits = soft_cap * jnp.tanh(logits / soft_cap)
    logits = jnp.where(vis[:, None, None, :], logits, -jnp.inf)
    logits = jnp.where(pad[:, None, None, None], 0.0, logits)
    if sinks is not None:       # the sink as column S of the softmax, dropped before P.V
        sink = jnp.broadcast_to(sinks.astype(work).reshape(1, K, G, 1), (T_total, K, G, 1))
        logits = jnp.concatenate([logits, sink], axis=-1)
    w = jax.nn.softmax(logits, axis=-1)[..., :S]
    # V past a request's length is 0 here: a weight of 0 times a NaN left in the cache's padding would be NaN
    v = jnp.where((jnp.arange(S)[None, :] < kv[:, None])[..., None, None], jnp.asarray(v_cache, work)[r], 0.0)
    out = jnp.einsum("tkgs,tskh->tkgh", w, v).reshape(T_total, N, H)
    return jnp.where(pad[:, None, None], 0.0, out).astype(q.dtype)
