"""Named mask modes and random test cases built from them (used by tests and GPU checks).

Every case keeps at least one visible key in each query row (rows that see nothing are
implementation-defined), except rows zeroed by ``query_seq_lengths``.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .inputs import random_qkv

MASK_MODES = (
    "none", "bias", "causal", "padding", "custom", "causal+padding", "custom+padding",
    "bias+causal", "causal+window", "window", "bias+window+padding",
)


def build(mode: str, batch=2, q_len=16, kv_len=16, heads=4, kv_heads=2, head_dim=16, dtype="float32", seed=0):
    """(q, k, v, kwargs) for ``attention(q, k, v, **kwargs)`` in mask mode ``mode``."""
    if mode not in MASK_MODES:
        raise ValueError(f"mode must be one of {MASK_MODES}, got {mode!r}")
    q, k, v = random_qkv(batch, q_len, kv_len, heads, kv_heads, head_dim, dtype, seed)
    rng = np.random.default_rng(seed + 1000)
    parts = set(mode.split("+"))
    kw: dict = {}
    if "bias" in parts:
        kw["bias"] = jnp.asarray(rng.standard_normal((batch, heads, q_len, kv_len)), dtype)
    if "causal" in parts:
        kw["is_causal"] = True
    if "window" in parts:
        kw["local_window_size"] = (max(1, kv_len // 4), 0 if "causal" in parts else max(1, kv_len // 8))
    if "padding" in parts:
        # the last batch element keeps full length; lengths >= 1 keep key 0 (and the diagonal) visible
        ql = rng.integers(1, q_len + 1, size=batch)
        kl = rng.integers(max(1, min(q_len, kv_len)), kv_len + 1, size=batch)
        ql[-1], kl[-1] = q_len, kv_len
        kw["query_seq_lengths"] = jnp.asarray(ql, jnp.int32)
        kw["key_value_seq_lengths"] = jnp.asarray(kl, jnp.int32)
    if "custom" in parts:
        m = rng.random((batch, 1, q_len, kv_len)) < 0.6
        m[..., 0] = True
        kw["mask"] = jnp.asarray(m)
    return q, k, v, kw
