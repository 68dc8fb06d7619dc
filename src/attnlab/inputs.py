"""Random attention inputs (standard normal, never zeros) for tests, benchmarks and the lab."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def random_qkv(batch: int, q_len: int, kv_len: int, heads: int, kv_heads: int, head_dim: int,
               dtype="float32", seed: int = 0):
    """q (B, T, N, H), k and v (B, S, K, H), drawn N(0, 1) in float32 then cast to ``dtype``."""
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(kq, (batch, q_len, heads, head_dim), jnp.float32).astype(dtype)
    k = jax.random.normal(kk, (batch, kv_len, kv_heads, head_dim), jnp.float32).astype(dtype)
    v = jax.random.normal(kv, (batch, kv_len, kv_heads, head_dim), jnp.float32).astype(dtype)
    return q, k, v


def for_workload(w, seed: int = 0):
    return random_qkv(w.batch, w.q_len, w.kv_len, w.heads, w.kv_heads, w.head_dim, w.dtype, seed)
