"""Random attention inputs (standard normal, never zeros) for tests, benchmarks and the lab."""
from __future__ import annotations

import functools
import hashlib
import math

import jax
import jax.numpy as jnp
import numpy as np

#: How the inputs are drawn, recorded with each cell (``inputs_draw``): "threefry-v1" is the draw below
#: (q, k, v from ``split(key(seed), 3)``, cotangents from ``key(seed + 100 + i)``, ``_normal``'s buckets),
#: bit-identical to every attnlab draw before the field existed. A new draw must get a new name.
INPUTS_DRAW = "threefry-v1"

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


@functools.lru_cache(maxsize=256)
def _key(seed: int):
    """``jax.random.key(seed)``, made once per seed and process (making one cost 1.3 s on a GPU)."""
    return jax.random.key(seed)


@functools.lru_cache(maxsize=256)
def _qkv_keys(seed: int):
    return tuple(jax.random.split(_key(seed), 3))


def cotangent(seed: int, shape) -> jax.Array:
    """The float32 N(0, 1) cotangent a fwd+bwd / bwd cell's output receives: ``_normal(key(seed), shape)``."""
    return _normal(_key(int(seed)), tuple(shape))


def random_qkv(batch: int, q_len: int, kv_len: int, heads: int, kv_heads: int, head_dim: int,
               dtype="float32", seed: int = 0):
    """q (B, T, N, H), k and v (B, S, K, H), drawn N(0, 1) in float32 then cast to ``dtype``."""
    kq, kk, kv = _qkv_keys(int(seed))
    q = _normal(kq, (batch, q_len, heads, head_dim)).astype(dtype)
    k = _normal(kk, (batch, kv_len, kv_heads, head_dim)).astype(dtype)
    v = _normal(kv, (batch, kv_len, kv_heads, head_dim)).astype(dtype)
    return q, k, v


def for_workload(w, seed: int = 0):
    return random_qkv(w.batch, w.q_len, w.kv_len, w.heads, w.kv_heads, w.head_dim, w.dtype, seed)


def seed_of(text: str) -> int:
    """A stable 32-bit seed from a string (the same in every process, unlike ``hash``)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def random_sinks(heads: int):
    """(N,) float32 attention sinks (one logit per query head, gpt-oss's), standard normal, seeded by the
    head count only: every backend, cell and run of N heads sees the same sinks (NumPy, on the host)."""
    return np.random.default_rng(seed_of(f"sinks N{int(heads)}")).standard_normal(int(heads)).astype(np.float32)
