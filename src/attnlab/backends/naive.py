"""The codelab's attention written out in jax.numpy: scores, scale + softmax (float32), attend, output.

GQA is done by viewing the N query heads as (K, G) and letting einsum broadcast each
key/value head over its G query heads; no key/value copy is made.
Rows that see no key at all give 0 (as FlashAttention does). ``sinks`` (N,) add exp(sink - m) to each
row's softmax denominator (gpt-oss's attention sinks: a logit with no value). Masked logits take jax.nn's finite
large negative (``attnlab.core.masking``), never ``-inf``: no Inf appears in the forward or backward
pass, so masked calls run under ``jax.debug_infs(True)``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..core import segments
from ..core.masking import large_negative, large_negative_value
from ..core.call import Call
from .base import Backend, query_keep, zero_padded_queries


def _grouped(x, K: int, G: int):
    """(b, n, t, s) bias/mask with n in {1, N} -> (b, K, G, t, s) or (b, 1, 1, t, s)."""
    b, n, t, s = x.shape
    return x.reshape(b, K, G, t, s) if n != 1 else x.reshape(b, 1, 1, t, s)


def visible_mask(p: Call):
    """Bool mask broadcastable to (B, K, G, T, S): True where query t may attend key s."""
    T, S = p.q_len, p.kv_len
    t = jnp.arange(T)[:, None]
    s = jnp.arange(S)[None, :]
    vis = jnp.ones((T, S), bool)
    if p.is_causal:
        vis &= s <= t
    if p.window is not None:
        left, right = p.window
        vis &= (s >= t - left) & (s <= t + right)
    vis = vis[None, None, None]
    if p.mask is not None:
        vis = vis & _grouped(p.mask, p.kv_heads, p.groups)
    if p.kv_lengths is not None:
        kv = jnp.asarray(p.kv_lengths, jnp.int32)
        vis = vis & (jnp.arange(S)[None, :] < kv[:, None])[:, None, None, None, :]
    if p.q_segment_ids is not None:
        vis = vis & segments.visible(p.q_segment_ids, p.kv_segment_ids)[:, :, None]
    return vis


def soft_capped(logits, cap):
    """``cap * tanh(logits / cap)`` (Gemma-2, Grok-1), or ``logits`` when ``cap`` is None."""
    return logits if cap is None else cap * jnp.tanh(logits / cap)


def _logsumexp(row_max, denom, p: Call):
    """jax.nn's residual from the softmax's pieces (B, K, G, T, 1): lse (B, T, N) in the input dtype.

    A row that sees no key, and a padded query row, gets ``large_negative_value(dtype)`` (-0.7 x
    the dtype's max, capped at float32's: finite in every dtype, float16 included). No gradient
    flows through it (jax.nn stops it too)."""
    B, K, G, T, _ = row_max.shape
    seen = denom[..., 0] > 0
    keep = query_keep(p)
    if keep is not None:
        seen &= keep[:, None, None, :]
    lse = jnp.log(jnp.where(seen, denom[..., 0], 1.0)) + row_max[..., 0]
    lse = jnp.where(seen, lse, jnp.asarray(large_negative_value(p.query.dtype), lse.dtype))
    lse = jnp.transpose(lse, (0, 3, 1, 2)).reshape(B, T, K * G)
    return jax.lax.stop_gradient(lse).astype(p.query.dtype)


class NaiveBackend(Backend):
    name = "naive"
    peer_parts = ("quick",)
    ring_blocks = True      # ring attention's blockwise kernel is this computation
    description = "attention written out in jax.numpy (the codelab's four steps)"
    portable = True
    residual = True
    takes_soft_cap = True
    takes_segment_ids = True
    takes_sinks = True
    takes_any_scale = True
    takes_decode_window = True     # the masked decode path folds the window into its mask
    takes_kv_scales = True      # decode / serving: the masked path dequantizes the cache in float32

    def run(self, p: Call):
        B, T, N, H = p.query.shape
        K, G = p.kv_heads, p.groups
        q = p.query.reshape(B, T, K, G, H)
        # 1. scores: (B, K, G, T, S), accumulated in float32 (float64 stays float64)
        acc = jnp.promote_types(p.query.dtype, jnp.float32)
        scores = jnp.einsum("btkgh,bskh->bkgts", q, p.key, preferred_element_type=acc)
        # 2. scale, bias, soft cap, masks, softmax in float32
        scores = scores * jnp.asarray(p.scale, acc)
        if p.bias is not None:
            scores = scores + _grouped(p.bias, K, G).astype(acc)
        scores = soft_capped(scores, p.soft_cap)
        vis = visible_mask(p)
        scores = jnp.where(vis, scores, large_negative(acc))
        # the max of the keys the row sees (a bias below the masked value, finfo.min, must not lose to it), at least
        # the dtype's lowest finite value: a row that sees none, or only -inf (a -inf bias), weighs its keys exactly 0
        lowest = jnp.asarray(jnp.finfo(scores.dtype).min, scores.dtype)   # scores': acc may be float64 without x64
        row_max = jax.lax.stop_gradient(jnp.maximum(jnp.max(jnp.where(vis, scores, lowest), axis=-1, keepdims=True),
                                                    lowest))
        sink = None if p.sinks is None else p.sinks.astype(acc).reshape(1, K, G, 1, 1)
        if sink is not None:    # m = max(row max, sink): exp(sink - m) never overflows
            row_max = jnp.maximum(row_max, jax.lax.stop_gradient(sink))
        # masked keys weigh exactly 0; a row that sees no key has weights 0 and gives 0
        weights = jnp.where(vis, jnp.exp(jnp.where(vis, scores, row_max) - row_max), 0.0)   # masked: exp(0), then 0
        denom = jnp.sum(weights, axis=-1, keepdims=True)
        if sink is not None:    # the sink's weight: in the denominator, with no value
            denom = denom + jnp.exp(sink - row_max)
        probs = weights / jnp.where(denom == 0, 1.0, denom)
        # 3. attend: probabilities in the input dtype, accumulation in float32
        out = jnp.einsum("bkgts,bskh->btkgh", probs.astype(p.value.dtype), p.value, preferred_element_type=acc)
        # 4. output in the input dtype, padded query rows zeroed
        out = zero_padded_queries(out.reshape(B, T, N, H), p).astype(p.query.dtype)
        if not p.return_residual:
            return out
        return out, _logsumexp(row_max, denom, p)
