"""FP8 attention error in emulation (issue 15): which tensor's e4m3 rounding costs what, and which recipe helps.

This is an EMULATION, not cuDNN's kernel: attention in float64 NumPy where the named tensors are
rounded to float8_e4m3fn (ml_dtypes) with a scale, x -> e4m3(clip(x * s, +-448)) / s, and everything
else stays float64. Tensors, one at a time and all together:

    q, k, v   the inputs (after the recipe's rotation / smoothing, if any)
    P         the softmax's unnormalised probabilities P~ = exp(s - rowmax) in [0, 1] (max 1 per
              row), as a flash kernel holds them before P~·V; the row sums l are taken from the
              unrounded P~ and O = (P~ V) / l. The kernel's running max differs from the final
              row max in early tiles; this emulation uses the final one.
    O         the output, rounded to e4m3 at the end (cuDNN's FP8 output).

Recipes (the scale s of each rounded tensor):
    unit          s = 1
    amax          per-tensor s = 448 / amax(|x|)  (P~: amax = 1, s = 448)
    pow2          per-tensor s = 2^floor(log2(448 / amax))
    block64       per-block amax: 64-row blocks along T (q, O) or S (k, v), per head; P~: 64x64 tiles
    hadamard      q, k rotated along H by R = hadamard(H)/sqrt(H) * diag(random signs), then amax
                  (R orthonormal: (qR)(kR)^T = q k^T exactly in real arithmetic)
    smooth-k      k -= mean over S of k (per batch and head), then amax (exact for softmax)
    had+smooth+block  all three

The anchor is ``attnlab.reference.float64.reference_attention(..., emulate="bfloat16")`` (the kernel-like
bf16 emulation). Errors: relative L2 against float64 attention of the same (float32) inputs.
benchmarks/fp8/emulation.py runs it over the input distributions and writes the tables.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn
FP8_MAX = 448.0
BLOCK = 64
TENSORS = ("q", "k", "v", "P", "O")
COLUMNS = TENSORS + ("qkvP", "all")     # qkvP: all but O (output kept in float64, as with a bf16 output)
RECIPES = {
    "unit": dict(scale="unit"),
    "amax": dict(scale="amax"),
    "pow2": dict(scale="pow2"),
    "block64": dict(scale="block"),
    "hadamard": dict(scale="amax", rotate=True),
    "smooth-k": dict(scale="amax", smooth=True),
    "had+smooth+block": dict(scale="block", rotate=True, smooth=True),
}


def e4m3(x: np.ndarray, scale=1.0) -> np.ndarray:
    """x rounded to float8_e4m3fn at ``scale`` (saturating at +-448), back in float64 and unscaled."""
    y = np.clip(np.asarray(x, np.float64) * scale, -FP8_MAX, FP8_MAX)
    return y.astype(E4M3).astype(np.float64) / scale


def _scale_from_amax(amax, kind: str):
    amax = np.asarray(amax, np.float64)
    s = np.where(amax > 0, FP8_MAX / np.where(amax > 0, amax, 1.0), 1.0)
    if kind == "pow2":
        s = np.exp2(np.floor(np.log2(s)))
    return s


def scale_for(x: np.ndarray, kind: str):
    """The scale of x (B, L, heads, H) under ``kind`` (unit / amax / pow2 / block), broadcastable to x.

    block: one scale per (batch, 64-row block along L, head), from the block's amax over rows and H."""
    if kind == "unit":
        return 1.0
    if kind in ("amax", "pow2"):
        return float(_scale_from_amax(np.abs(x).max(), kind))
    if kind != "block":
        raise ValueError(kind)
    B, L, Nh, H = x.shape
    nb = -(-L // BLOCK)
    a = np.pad(np.abs(x), ((0, 0), (0, nb * BLOCK - L), (0, 0), (0, 0))).reshape(B, nb, BLOCK, Nh, H)
    s = _scale_from_amax(a.max(axis=(2, 4)), "amax")             # (B, nb, Nh)
    return np.repeat(s, BLOCK, axis=1)[:, :L, :, None]


def random_hadamard(H: int, seed: int = 0) -> np.ndarray:
    """(H, H) orthonormal: the Sylvester Hadamard matrix / sqrt(H) with random column signs."""
    from scipy.linalg import hadamard  # heavy: scipy.linalg, for the Hadamard recipe only
    signs = np.random.default_rng([seed, 15]).choice([-1.0, 1.0], size=H)
    return hadamard(H).astype(np.float64) / math.sqrt(H) * signs[None, :]


def fp8_attention(q, k, v, *, is_causal=False, quantize=(), recipe="amax", seed=0) -> np.ndarray:
    """Attention (B, T, N, H) in float64 with the tensors in ``quantize`` rounded to e4m3 as ``recipe`` says.

    k, v are (B, S, K, H) with N a multiple of K. With ``quantize=()`` and any recipe this is float64
    attention (rotation and smoothing change nothing but rounding at 1e-16)."""
    cfg = RECIPES[recipe]
    kind = cfg["scale"]
    quantize = set(TENSORS if quantize == "all" else quantize)
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    if cfg.get("smooth"):
        k = k - k.mean(axis=1, keepdims=True)
    if cfg.get("rotate"):
        R = random_hadamard(H, seed)
        q, k = q @ R, k @ R
    if "q" in quantize:
        q = e4m3(q, scale_for(q, kind))
    if "k" in quantize:
        k = e4m3(k, scale_for(k, kind))
    if "v" in quantize:
        v = e4m3(v, scale_for(v, kind))
    sm = 1.0 / math.sqrt(H)
    vis = np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T) if is_causal else None
    out = np.empty((B, T, N, H))
    for b in range(B):
        for n in range(N):
            kv = n // (N // K)
            s = (q[b, :, n] @ k[b, :, kv].T) * sm
            if vis is not None:
                s = np.where(vis, s, -np.inf)
            m = s.max(axis=-1, keepdims=True)
            p = np.exp(s - m)
            l = p.sum(axis=-1, keepdims=True)
            if "P" in quantize:
                if kind == "block":
                    ps = _tile_scale(p)
                else:
                    ps = {"unit": 1.0, "amax": FP8_MAX, "pow2": 256.0}[kind]   # amax(P~) = 1
                p = e4m3(p, ps)
            out[b, :, n] = (p @ v[b, :, kv]) / l
    if "O" in quantize:
        out = e4m3(out, scale_for(out, kind))
    return out


def _tile_scale(p: np.ndarray) -> np.ndarray:
    """Per 64x64 tile scale 448 / amax of a (T, S) matrix, broadcast back to (T, S)."""
    T, S = p.shape
    tb, sb = -(-T // BLOCK), -(-S // BLOCK)
    a = np.pad(p, ((0, tb * BLOCK - T), (0, sb * BLOCK - S))).reshape(tb, BLOCK, sb, BLOCK)
    s = _scale_from_amax(a.max(axis=(1, 3)), "amax")
    return np.repeat(np.repeat(s, BLOCK, 0), BLOCK, 1)[:T, :S]


def reference(q, k, v, is_causal=False) -> np.ndarray:
    return fp8_attention(q, k, v, is_causal=is_causal, quantize=())


def rel_l2(out, ref) -> float:
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


_HEAD = {"qkvP": "q,k,v,P (not O)", "all": "all"}


def table(rows: list[dict]) -> str:
    """Markdown: one table per (T, causal); rows recipe x distribution; errors in %."""
    out = []
    keys = sorted({(r["T"], r["causal"]) for r in rows})
    dists = list(dict.fromkeys(r["dist"] for r in rows))
    recipes = list(dict.fromkeys(r["recipe"] for r in rows if r["recipe"] != "bf16-emulation"))
    get = {(r["T"], r["causal"], r["dist"], r["recipe"], r["quantized"]): r["rel_l2"] for r in rows}
    for T, causal in keys:
        out.append(f"\n### T = S = {T}, {'causal' if causal else 'non-causal'} (rel L2 vs float64, %)\n")
        out.append("| recipe | distribution | " + " | ".join(_HEAD.get(c, f"only {c}") for c in COLUMNS)
                   + " | bf16 anchor | amax / recipe (qkvP) | amax / recipe (all) |")
        out.append("|---|---|" + "---:|" * (len(COLUMNS) + 3))
        for recipe in recipes:
            for dist in dists:
                vals = [get.get((T, causal, dist, recipe, c)) for c in COLUMNS]
                bf = get.get((T, causal, dist, "bf16-emulation", "all"))
                r4 = get.get((T, causal, dist, "amax", "qkvP"), math.nan) / vals[-2]
                ratio = get.get((T, causal, dist, "amax", "all"), math.nan) / vals[-1]
                out.append(f"| {recipe} | {dist} | " + " | ".join(f"{100 * x:.3f}" for x in vals)
                           + f" | {100 * bf:.3f} | {r4:.2f}x | {ratio:.2f}x |")
    return "\n".join(out) + "\n"
