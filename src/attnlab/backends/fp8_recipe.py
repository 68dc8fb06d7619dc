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
    a power of two. Runs inside the backend's jitted call, so its cost is timed. ``rotation`` says how:
``rotation``
    ``f32``: x @ R in float32 at ``Precision.HIGHEST`` (the first version: emulated-fp32 matmul rate
    and a float32 copy of q and k through HBM); ``bf16``: x @ S in the input dtype, S = R sqrt(H)
    the +-1 matrix (exact in bf16/fp16), float32 accumulation rounded once to the input dtype, then
    the recipe's scale over the rotated tensor; the missing 1/sqrt(H) of q and of k is folded into
    the softmax scale (divided by H, exact for a power of two); ``fused``: the same product
    quantised straight from the matmul, with a per-tensor scale that needs no pass over the rotated
    tensor: |(x S)_j| <= sqrt(H) ||x||_2 (Cauchy-Schwarz, S's columns have norm sqrt(H)), so
    ``448 / (sqrt(H) max_rows ||x||_2)`` never saturates; it is at most sqrt(H) smaller than the
    rotated tensor's amax scale, which costs e4m3 (a floating-point format) only values pushed
    under its smallest normal, 2^-6.
``smooth_k``
    k minus its mean over S, per (batch, kv head) (SageAttention): every logit of a row moves by
    the same q·mean, which softmax ignores; the common key offset no longer eats e4m3's range.

Smoothing works in float32; the ``f32`` rotation returns float32, the ``bf16`` one the input dtype.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

E4M3_MAX = 448.0
SCALES = ("amax", "unit", "pow2")
ROTATIONS = ("f32", "bf16", "fused")
#: Seed of the random signs of the Hadamard rotation (fixed: every run rotates the same way).
HADAMARD_SEED = 15


@dataclasses.dataclass(frozen=True)
class Fp8Recipe:
    """How q, k, v and P are scaled and transformed before e4m3 (see the module doc)."""
    scales: str = "amax"
    softmax_scale: float = E4M3_MAX
    hadamard: bool = False
    smooth_k: bool = False
    #: How the Hadamard rotation is computed (module doc); records before it existed rotated in f32.
    rotation: str = "bf16"

    def __post_init__(self):
        if self.scales not in SCALES:
            raise ValueError(f"scales must be one of {SCALES}, got {self.scales!r}")
        if not 0 < self.softmax_scale <= E4M3_MAX:
            raise ValueError(f"softmax_scale must be in (0, 448], got {self.softmax_scale!r}")
        if self.rotation not in ROTATIONS:
            raise ValueError(f"rotation must be one of {ROTATIONS}, got {self.rotation!r}")
        if self.rotation == "fused" and (self.scales != "amax" or not self.hadamard):
            raise ValueError("rotation='fused' takes its own q/k scale: it needs hadamard=True and scales='amax'")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        parts = [{"amax": "per-tensor amax scales", "unit": "unit scales",
                  "pow2": "per-tensor power-of-two scales (amax rounded down)"}[self.scales]]
        if self.scales != "unit":
            parts.append(f"P scaled by {self.softmax_scale:g}")
        if self.hadamard:
            how = {"f32": "in float32", "bf16": "in the input dtype",
                   "fused": "fused with quantisation at a norm-bound scale"}[self.rotation]
            parts.append(f"random Hadamard rotation of q and k along H ({how})")
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
    "hadamard-f32": Fp8Recipe(hadamard=True, rotation="f32"),
    "hadamard-fused": Fp8Recipe(hadamard=True, rotation="fused"),
    "smoothk": Fp8Recipe(smooth_k=True),
    "hadamard-smoothk": Fp8Recipe(hadamard=True, smooth_k=True),
}


#: The recipe called by name (``--fp8-recipe``, ``attention(fp8_recipe=...)``): ``amax`` is the empty suffix.
AMAX = "amax"


def backend_name(suffix: str) -> str:
    """``cudnn-fp8`` + ``-suffix``: the name a recipe's records carry (the backend's configured variant)."""
    return "cudnn-fp8" + (f"-{suffix}" if suffix else "")


def recipe_names() -> list[str]:
    """The recipes by name, as ``--fp8-recipe`` takes them: amax, unit, pow2, ..."""
    return [s or AMAX for s in RECIPES]


def suffix_of(name: str) -> str | None:
    """The recipe suffix a backend name carries (``cudnn-fp8-hadamard`` -> ``hadamard``, ``cudnn-fp8`` -> ""),
    None for a name that is no recipe's: how old records' recipes are recovered from their names."""
    if name == "cudnn-fp8":
        return ""
    suffix = name.removeprefix("cudnn-fp8-")
    return suffix if suffix != name and suffix in RECIPES else None


def name_of_recipe(recipe: str) -> str:
    """The backend name of the recipe called ``recipe`` (``hadamard`` -> ``cudnn-fp8-hadamard``); ValueError
    naming the known recipes otherwise."""
    suffix = "" if recipe == AMAX else recipe
    if not isinstance(recipe, str) or recipe == "" or suffix not in RECIPES:
        raise ValueError(f"fp8_recipe must be one of {', '.join(recipe_names())}, got {recipe!r}")
    return backend_name(suffix)


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
    return (sign_matrix(H, seed) / np.sqrt(H)).astype(np.float32)


@functools.lru_cache(maxsize=None)
def sign_matrix(H: int, seed: int = HADAMARD_SEED) -> np.ndarray:
    """(H, H) float32 S = diag(+-1) @ Sylvester-Hadamard(H): entries exactly +-1, S S^T = H I (R = S / sqrt(H))."""
    if H < 1 or H & (H - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head dim, got {H}")
    h = np.ones((1, 1))
    while h.shape[0] < H:
        h = np.block([[h, h], [h, -h]])
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=H)
    return (signs[:, None] * h).astype(np.float32)


def rotate(x, R) -> jax.Array:
    """x (..., H) @ R (H, H) in float32 at full precision: the same R for q and k keeps q·k."""
    return jnp.einsum("...h,hg->...g", x.astype(jnp.float32), jnp.asarray(R), precision=jax.lax.Precision.HIGHEST)


def rotate_unnormalised(x, dtype, out_dtype=None) -> jax.Array:
    """x (..., H) @ S (the +-1 sign matrix) in ``dtype`` with float32 accumulation, out in ``out_dtype``
    (default ``dtype``): sqrt(H) times x @ R, without a rounding of S (1/sqrt(H) is inexact in bf16)."""
    S = jnp.asarray(sign_matrix(x.shape[-1]), dtype)
    return jnp.einsum("...h,hg->...g", x.astype(dtype), S, preferred_element_type=out_dtype or dtype)


def norm_bound_scale(x) -> jax.Array:
    """Scalar float32 ``448 / (sqrt(H) max over rows of ||x||_2)``: no entry of x @ S exceeds 448 at it."""
    H = x.shape[-1]
    norm = jnp.sqrt(jnp.max(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=-1)))
    return E4M3_MAX / jnp.maximum(norm * np.float32(np.sqrt(H)), 1e-12)


def smooth_keys(k) -> jax.Array:
    """k (B, S, K, H) minus its mean over S per (batch, kv head), float32; softmax(q k^T) is unchanged."""
    k = k.astype(jnp.float32)
    return k - jnp.mean(k, axis=1, keepdims=True)


def quantised_qk(recipe: Fp8Recipe, q, k):
    """The recipe's (q8, k8, sq, sk, gain): e4m3 q (B, T, N, H) and k (B, S, K, H), their float32
    scales (q8 = q' sq), and ``gain``, the exact power of two the transform multiplied q·k by (the
    softmax scale is divided by it). v is never transformed."""
    dtype = q.dtype
    if recipe.smooth_k:
        k = smooth_keys(k).astype(dtype) if recipe.hadamard and recipe.rotation != "f32" else smooth_keys(k)
    gain = 1.0
    if recipe.hadamard and recipe.rotation == "f32":
        R = hadamard_matrix(q.shape[-1])
        q, k = rotate(q, R), rotate(k, R)
    elif recipe.hadamard and recipe.rotation == "bf16":
        # the product in the input dtype, but float16's: an entry of x @ S reaches sqrt(H) ||x||, past 65504
        out = jnp.float32 if dtype == jnp.float16 else dtype
        q, k, gain = rotate_unnormalised(q, dtype, out), rotate_unnormalised(k, dtype, out), float(q.shape[-1])
    elif recipe.hadamard:   # fused: scale from the unrotated rows, quantised from the float32 product
        sq, sk = norm_bound_scale(q), norm_bound_scale(k)
        q8 = quantise(rotate_unnormalised(q, dtype, jnp.float32), sq)
        # k's product waits for q8: otherwise XLA's dot merger joins the two matmuls (they share S)
        # into one float32 matmul whose output it cannot quantise in the epilogue (H200, T=4096:
        # 131072x128 f32 written then converted; results/gpu-2026-12-03d-fp8-rotation/hlo)
        k, _ = jax.lax.optimization_barrier((k, q8))
        k8 = quantise(rotate_unnormalised(k, dtype, jnp.float32), sk)
        return q8, k8, sq, sk, float(q.shape[-1])
    sq, sk = tensor_scale(q, recipe.scales), tensor_scale(k, recipe.scales)
    return quantise(q, sq), quantise(k, sk), sq, sk, gain
