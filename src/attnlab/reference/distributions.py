"""Named input distributions for attention (q, k, v), for the FP8 studies of issue 15.

``make_qkv(dist, B, T, S, N, K, H, dtype="float32", seed=0)`` returns NumPy arrays q (B, T, N, H),
k and v (B, S, K, H) in ``dtype``. Every distribution starts from ``attnlab.reference.inputs.random_qkv``'s
standard-normal draw (float32, same seed) and changes it with a NumPy generator seeded by ``seed``:

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

The module is pure NumPy apart from the gaussian draw it borrows from ``attnlab.reference.inputs``.
"""
from __future__ import annotations

import numpy as np

from .inputs import random_qkv

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
