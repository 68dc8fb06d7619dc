"""FP8 attention recipes as data, and the pure-JAX transforms they apply before quantising (issue 15).

A recipe (``Fp8Recipe``) says how ``cudnn-fp8*`` turns bf16/fp16 q (B, T, N, H), k, v (B, S, K, H)
into float8_e4m3fn for cuDNN's FP8 attention, and what the P (softmax) scale is:

``scales``
    ``amax``: per-tensor ``448 / amax(|x|)`` (the largest value lands on e4m3's maximum);
    ``unit``: every scale 1, P's included (as JAX's own tests call the kernel);
    ``pow2``: the amax scale rounded down to a power of two, ``2^floor(log2(448 / amax))``, so the
    scales and descales of q, k, v are exact in float32 and the largest value stays <= 448 (P's scale
    is ``softmax_scale``'s: 448 unless a variant sets 256).
``softmax_scale``
    The scale of the unnormalised probabilities P~ = exp(s - rowmax) in [0, 1] before they are
    rounded to e4m3 (the ``unit`` recipe sets it to 1). 448 (today's) maps P~ = 1 onto e4m3's maximum
    and keeps small P~ out of e4m3's subnormals (< 2^-6) down to 2^-6/448 ~ 3.5e-5. The variants:
    256, the largest power of two <= 448 (P~ = 1 becomes 2^8 exactly, the descale 2^-8 is exact; it
    gives up 0.8 bit of range at the small end); 1, P~ unscaled with q, k, v still amax-scaled,
    which isolates what unit scales cost through P alone (every P~ < 2^-6 ~ 0.016 subnormal,
    < 2^-10 flushed to 0: a softmax over 16k keys is mostly there).
``hadamard``
    q and k rotated along H by the same orthogonal R = diag(random +-1 signs) Hadamard(H) / sqrt(H)
    (FlashAttention-3's incoherent processing): (qR)(kR)^T = q k^T in real arithmetic, and an
    outlier channel is spread over all H channels before the per-tensor scale is taken. H must be
    a power of two. Runs inside the backend's jitted call, so its cost is timed.
``smooth_k``
    k minus its mean over S, per (batch, kv head) (SageAttention): every logit of a row moves by
    the same q·mean, which softmax ignores; the common key offset no longer eats e4m3's range.

Every transform works in float32 and returns float32 of the input's shape.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

E4M3_MAX = 448.0
SCALES = ("amax", "unit", "pow2")
#: Seed of the random signs of the Hadamard rotation (fixed: every run rotates the same way).
HADAMARD_SEED = 15


@dataclasses.dataclass(frozen=True)
class Fp8Recipe:
    """How q, k, v and P are scaled and transformed before e4m3 (see the module doc)."""
    scales: str = "amax"
    softmax_scale: float = E4M3_MAX
    hadamard: bool = False
    smooth_k: bool = False

    def __post_init__(self):
        if self.scales not in SCALES:
            raise ValueError(f"scales must be one of {SCALES}, got {self.scales!r}")
        if not 0 < self.softmax_scale <= E4M3_MAX:
            raise ValueError(f"softmax_scale must be in (0, 448], got {self.softmax_scale!r}")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        parts = [{"amax": "per-tensor amax scales", "unit": "unit scales",
                  "pow2": "per-tensor power-of-two scales (amax rounded down)"}[self.scales]]
        if self.scales != "unit":
            parts.append(f"P scaled by {self.softmax_scale:g}")
        if self.hadamard:
            parts.append("random Hadamard rotation of q and k along H")
        if self.smooth_k:
            parts.append("K smoothed (mean key over S subtracted)")
        return ", ".join(parts)


#: Backend-name suffix -> recipe: ``cudnn-fp8`` + suffix (the empty suffix is today's amax recipe).
RECIPES: dict[str, Fp8Recipe] = {
    "": Fp8Recipe(),
    "unit": Fp8Recipe(scales="unit", softmax_scale=1.0),
    "pow2": Fp8Recipe(scales="pow2"),
    "s256": Fp8Recipe(softmax_scale=256.0),
    "s1": Fp8Recipe(softmax_scale=1.0),
    "hadamard": Fp8Recipe(hadamard=True),
    "smoothk": Fp8Recipe(smooth_k=True),
    "hadamard-smoothk": Fp8Recipe(hadamard=True, smooth_k=True),
}


def backend_name(suffix: str) -> str:
    return "cudnn-fp8" + (f"-{suffix}" if suffix else "")


def amax_scale(x) -> jax.Array:
    """Scalar float32 ``448 / amax(|x|)`` (amax floored at 1e-12)."""
    amax = jnp.max(jnp.abs(x.astype(jnp.float32)))
    return E4M3_MAX / jnp.maximum(amax, 1e-12)


def pow2_scale(x) -> jax.Array:
    """Scalar float32: ``amax_scale(x)`` rounded down to a power of two (<= it, exact reciprocal)."""
    return jnp.exp2(jnp.floor(jnp.log2(amax_scale(x))))


def tensor_scale(x, scales: str) -> jax.Array:
    if scales == "unit":
        return jnp.float32(1.0)
    return pow2_scale(x) if scales == "pow2" else amax_scale(x)


def quantise(x, scale) -> jax.Array:
    """x * scale saturated to +-448 and rounded to float8_e4m3fn (same shape)."""
    y = jnp.clip(x.astype(jnp.float32) * scale, -E4M3_MAX, E4M3_MAX)
    return y.astype(jnp.float8_e4m3fn)


@functools.lru_cache(maxsize=None)
def hadamard_matrix(H: int, seed: int = HADAMARD_SEED) -> np.ndarray:
    """(H, H) float32 orthogonal R = diag(+-1) @ Sylvester-Hadamard(H) / sqrt(H); H a power of two."""
    if H < 1 or H & (H - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head dim, got {H}")
    h = np.ones((1, 1))
    while h.shape[0] < H:
        h = np.block([[h, h], [h, -h]])
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=H)
    return (signs[:, None] * h / np.sqrt(H)).astype(np.float32)


def rotate(x, R) -> jax.Array:
    """x (..., H) @ R (H, H) in float32 at full precision: the same R for q and k keeps q·k."""
    return jnp.einsum("...h,hg->...g", x.astype(jnp.float32), jnp.asarray(R), precision=jax.lax.Precision.HIGHEST)


def smooth_keys(k) -> jax.Array:
    """k (B, S, K, H) minus its mean over S per (batch, kv head), float32; softmax(q k^T) is unchanged."""
    k = k.astype(jnp.float32)
    return k - jnp.mean(k, axis=1, keepdims=True)


def transform(recipe: Fp8Recipe, q, k):
    """(q, k) after the recipe's smoothing and rotation, float32 (v is never transformed)."""
    if recipe.smooth_k:
        k = smooth_keys(k)
    if recipe.hadamard:
        R = hadamard_matrix(q.shape[-1])
        q, k = rotate(q, R), rotate(k, R)
    return q.astype(jnp.float32), k.astype(jnp.float32)
