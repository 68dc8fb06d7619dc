"""The decode kernels' second step: their splits' partials combined by log-sum-exp, the GQA row packing undone.

Both decode kernels (``kernels.decode``, Triton; ``kernels.decode_mgpu``, Mosaic GPU) write per split an
unnormalised partial O (float32), a running max m (log2 units) and a sum l; attention sinks (gpt-oss's: one
more logit per query head, no value) join each row's denominator here, once, after the splits are merged.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

LOG2E = math.log2(math.e)


def sink_rows(sinks, *, kv_heads: int, groups: int, rows: int):
    """Sinks (N,) natural-log logits -> (K, rows) float32 in log2 units, laid out as the packed rows
    (row r of KV head h is query head h * G + r % G; rows past T*G repeat the pattern and are dropped)."""
    per_head = jnp.asarray(sinks).astype(jnp.float32).reshape(kv_heads, groups) * LOG2E
    return per_head[:, np.arange(rows) % groups]


def combine(o, m, l, sinks=None):
    """Log-sum-exp combine of the splits: o (B, K, P, R, H), m and l (B, K, P, R) -> (B, K, R, H) float32.

    m is in log2 units; a split that saw no key has m = NEG (finite), l = 0, o = 0 and weighs 0
    (2^(NEG - M) = 0 beside any split that saw a key). A row that saw no key at all (only with
    unchecked lengths under jit) has l = 0 everywhere and gives 0. ``sinks`` (K, R) float32 in log2
    units (``sink_rows``), or None: each row's denominator gets 2^(sink - M) once, after the splits
    are merged (the sink has no value), so every split count gives the same result.
    """
    top = jnp.max(m, axis=2, keepdims=True)
    if sinks is not None:
        top = jnp.maximum(top, sinks[None, :, None, :])
    w = jnp.exp2(m - top)                                   # (B, K, P, R)
    den = jnp.sum(w * l, axis=2)
    if sinks is not None:
        den = den + jnp.exp2(sinks[None] - top[:, :, 0])
    num = jnp.sum(w[..., None] * o, axis=2)
    return num / jnp.where(den == 0, 1.0, den)[..., None]


def combined_queries(o, m, l, *, q_len: int, groups: int, dtype, sinks=None):
    """``combine`` the splits and undo the GQA row packing: partials (B, K, P, >= T*G rows, H) -> (B, T, N, H).
    ``sinks``: None or (N,) float logits (natural-log units), one more logit per query head."""
    B, K, _, R, H = o.shape
    rows = None if sinks is None else sink_rows(sinks, kv_heads=K, groups=groups, rows=R)
    out = combine(o, m, l, rows)
    out = out[:, :, :q_len * groups].reshape(B, K, q_len, groups, H)
    return jnp.transpose(out, (0, 2, 1, 3, 4)).reshape(B, q_len, K * groups, H).astype(dtype)
