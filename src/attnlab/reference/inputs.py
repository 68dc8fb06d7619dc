"""Random attention inputs (never zeros) for tests, benchmarks and the lab: the normal draw and named distributions.

``random_qkv(B, T, S, N, K, H, dtype, seed)`` draws q (B, T, N, H), k and v (B, S, K, H) N(0, 1) in float32
(JAX, bit for bit the draw ``INPUTS_DRAW`` names) and casts them to ``dtype``.
``draw_sets(dist, B, T, S, N, K, H, dtype, seeds)``: a cell's input sets, one per seed, as JAX arrays in ``dtype``.
``make_qkv(dist, B, T, S, N, K, H, dtype="float32", seed=0)`` returns NumPy arrays of the same shapes drawn from
the distribution ``dist`` (``DISTRIBUTIONS``): each starts from ``random_qkv``'s float32 draw (same seed) and
changes it with a NumPy generator seeded by ``seed``:

``gaussian``
    ``random_qkv`` itself: every entry N(0, 1). Equal, value for value, to
    ``np.asarray(random_qkv(B, T, S, N, K, H, dtype, seed))``.
``outliers``
    FlashAttention-3's test inputs: N(0, 1) with a fraction ``OUTLIER_FRACTION`` (0.1%) of the
    entries of each of q, k and v, chosen independently at random, redrawn from N(0, 10^2).
``channel-outliers``
    As LLM activations: ``N_CHANNELS`` (4) head-dim channels, the same for q and k and for every
    head, chosen by the seed (``outlier_channels(H, seed)``), multiplied by ``CHANNEL_GAIN`` (20)
    in q and in k. v is unchanged. The logits' spread grows ~ 20^2 * sqrt(4/H) times, so the
    softmax is much sharper than on gaussian inputs.
``shifted-keys``
    Keys with a large common mean, which softmax ignores (q·(k_s + mu) = q·k_s + q·mu, the same
    shift for every key of a row): k += mu, one mu per kv head, mu = ``KEY_SHIFT`` * sqrt(H) * u with
    u a random unit vector in R^H (``key_shift(K, H, seed)``). Each channel's offset then has rms
    ``KEY_SHIFT`` (5) standard deviations of the noise, ||mu|| = 5 sqrt(H) (~57 for H=128, against
    ||k_s|| ~ sqrt(H) ~ 11). q and v are unchanged; the float64 attention is that of gaussian inputs
    up to rounding. (A shift of 5 along one unit direction only, 5 u, moves one channel's worth
    and barely changes an FP8 scale; this is the per-channel bias SageAttention removes.)
"""
from __future__ import annotations

import functools
import hashlib
import math
from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np

#: How the inputs are drawn, recorded with each cell (``inputs_draw``): "threefry-v1" is the draw below
#: (q, k, v from ``split(key(seed), 3)``, cotangents from ``key(seed + 100 + i)``, ``_normal``'s buckets),
#: bit-identical to every attnlab draw before the field existed. A new draw must get a new name.
INPUTS_DRAW = "threefry-v1"
#: A soft-capped cell's q is drawn times max(1, cap / CAP_REACH): N(0, 1) logits barely feel 50 tanh(x / 50) (a call
#: that dropped the cap passed its check); logits of sd cap / 5 reach ~0.8 cap, where tanh bends them by ~15%
CAP_REACH = 5.0


def cap_reach(soft_cap) -> float:
    """The factor a cell with ``soft_cap`` (None: none) draws its q times (``CAP_REACH``)."""
    return 1.0 if soft_cap is None else max(1.0, float(soft_cap) / CAP_REACH)


def inputs_draw(soft_cap) -> str:
    """The record's ``inputs_draw``: ``INPUTS_DRAW``, and q's factor where the soft cap scales it."""
    f = cap_reach(soft_cap)
    return INPUTS_DRAW if f == 1 else f"{INPUTS_DRAW}, q x{f:g} (the soft cap's reach)"

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


def seed_of(text: str) -> int:
    """A stable 32-bit seed from a string (the same in every process, unlike ``hash``)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def random_sinks(heads: int):
    """(N,) float32 attention sinks (one logit per query head, gpt-oss's), standard normal, seeded by the
    head count only: every backend, cell and run of N heads sees the same sinks (NumPy, on the host)."""
    return np.random.default_rng(seed_of(f"sinks N{int(heads)}")).standard_normal(int(heads)).astype(np.float32)


# --- named distributions (``make_qkv``; the FP8 studies' inputs) ----------------------------------------

DISTRIBUTIONS = ("gaussian", "outliers", "channel-outliers", "shifted-keys")

OUTLIER_FRACTION = 1e-3
OUTLIER_STD = 10.0
N_CHANNELS = 4
CHANNEL_GAIN = 20.0
KEY_SHIFT = 5.0

# Sub-streams of the NumPy generator, so each distribution's extra randomness is its own.
_STREAM = {"outliers": 1, "channel-outliers": 2, "shifted-keys": 3}


def _rng(dist: str, seed: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), _STREAM[dist]])


def outlier_channels(H: int, seed: int = 0) -> np.ndarray:
    """The sorted head-dim channels that ``channel-outliers`` scales for this seed."""
    return np.sort(_rng("channel-outliers", seed).choice(H, size=min(N_CHANNELS, H), replace=False))


def key_shift(K: int, H: int, seed: int = 0) -> np.ndarray:
    """(K, H) float64: the common key mean mu of ``shifted-keys``, per kv head (||mu|| = 5 sqrt(H))."""
    u = _rng("shifted-keys", seed).standard_normal((K, H))
    u /= np.linalg.norm(u, axis=-1, keepdims=True)
    return KEY_SHIFT * np.sqrt(H) * u


def _with_outliers(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    hit = rng.random(x.shape) < OUTLIER_FRACTION
    big = (OUTLIER_STD * rng.standard_normal(x.shape)).astype(x.dtype)
    return np.where(hit, big, x)


def make_qkv(dist: str, B: int, T: int, S: int, N: int, K: int, H: int, dtype="float32", seed: int = 0):
    """q (B, T, N, H), k, v (B, S, K, H) as NumPy arrays in ``dtype``, drawn from ``dist`` (see module doc)."""
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {dist!r}; choose one of {DISTRIBUTIONS}")
    q, k, v = (np.asarray(a) for a in random_qkv(B, T, S, N, K, H, "float32", seed))
    if dist == "outliers":
        rng = _rng(dist, seed)
        q, k, v = (_with_outliers(a, rng) for a in (q, k, v))
    elif dist == "channel-outliers":
        gain = np.ones(H, np.float32)
        gain[outlier_channels(H, seed)] = CHANNEL_GAIN
        q, k = q * gain, k * gain
    elif dist == "shifted-keys":
        k = (k + key_shift(K, H, seed)[None, None].astype(np.float32)).astype(np.float32)
    return tuple(np.asarray(a, np.float32).astype(dtype) for a in (q, k, v))


#: The last non-gaussian draws (NumPy makes them on the host, ~1 s at T=16k): every backend of a
#: sweep measured on one (distribution, shape, seed) reuses them. Kept on the host (float32 NumPy),
#: so no device memory outlives its cell (a cell's memory figures and headroom stay its own).
_DRAWS: OrderedDict = OrderedDict()
_DRAWS_KEPT = 4


def draw_sets(dist: str, B: int, T: int, S: int, N: int, K: int, H: int, dtype: str, seeds) -> list[tuple]:
    """One (q, k, v) set per seed of ``seeds`` as JAX arrays in ``dtype``: q (B, T, N, H), k, v (B, S, K, H), drawn
    from the distribution ``dist``: ``gaussian`` is ``random_qkv`` itself, any other ``make_qkv``'s float32 draw
    (the last ``_DRAWS_KEPT`` kept on the host for the next backend) cast to ``dtype``."""
    shape = (B, T, S, N, K, H)
    if dist == "gaussian":
        return [random_qkv(*shape, dtype, seed=seed) for seed in seeds]
    out = []
    for seed in seeds:
        key = (dist, shape, dtype, seed)
        if key not in _DRAWS:
            _DRAWS[key] = make_qkv(dist, *shape, "float32", seed=seed)
            while len(_DRAWS) > _DRAWS_KEPT:
                _DRAWS.popitem(last=False)
        _DRAWS.move_to_end(key)
        out.append(tuple(jnp.asarray(a).astype(dtype) for a in _DRAWS[key]))
    return out
