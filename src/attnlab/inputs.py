"""Random attention inputs (standard normal, never zeros) for tests, benchmarks and the lab."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

#: Tensors up to this many elements are drawn from one flat draw of a power-of-two size (see ``_normal``).
_BUCKET_MAX = 2**22
_BUCKET_MIN = 2**16


def _normal(key, shape) -> jax.Array:
    """``jax.random.normal(key, shape, float32)``, bit for bit, with one compile per size bucket.

    With JAX's partitionable threefry (the default) the value at flat index i depends only on the
    key and i, so the first n values of a longer draw are the draw of n values. Small tensors are
    therefore cut from a draw of the next power of two: XLA compiles the CPU threefry kernel once per
    bucket instead of once per shape (0.4-0.8 s each on a CPU, most of a small new cell's cost)."""
    n = math.prod(shape)
    if not jax.config.jax_threefry_partitionable or n > _BUCKET_MAX or n == 0:
        return jax.random.normal(key, shape, jnp.float32)
    size = max(_BUCKET_MIN, 1 << (n - 1).bit_length())
    return jax.random.normal(key, (size,), jnp.float32)[:n].reshape(shape)


def random_qkv(batch: int, q_len: int, kv_len: int, heads: int, kv_heads: int, head_dim: int,
               dtype="float32", seed: int = 0):
    """q (B, T, N, H), k and v (B, S, K, H), drawn N(0, 1) in float32 then cast to ``dtype``."""
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = _normal(kq, (batch, q_len, heads, head_dim)).astype(dtype)
    k = _normal(kk, (batch, kv_len, kv_heads, head_dim)).astype(dtype)
    v = _normal(kv, (batch, kv_len, kv_heads, head_dim)).astype(dtype)
    return q, k, v


def for_workload(w, seed: int = 0):
    return random_qkv(w.batch, w.q_len, w.kv_len, w.heads, w.kv_heads, w.head_dim, w.dtype, seed)
