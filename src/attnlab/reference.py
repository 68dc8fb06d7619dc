"""The truth for tests and benchmarks: attention in NumPy float64, written apart from JAX.

``reference_attention`` takes ``attnlab.attention``'s arguments (arrays of any kind
convertible by ``np.asarray``) and returns a float64 ``np.ndarray`` shaped like query.
``reference_attention_grads`` gives d(sum(out * cotangent))/d(q, k, v) in float64.
``reference_attention(..., emulate=dtype)`` carries the same computation out in a low
precision dtype (operands and each matmul's result rounded to it, softmax in float32):
the baseline of the tolerance policy below.

Tolerance policy (``check_close``)
    float64/float32: relative L2 error ||out - ref|| / ||ref|| <= 1e-5. On an NVIDIA GPU
        XLA's default float32 matmul precision uses TF32 (10-bit mantissa; measured on the
        H200: 4e-4 at B=4, T=128, N=8, H=64), so there the limit is 2e-3 unless
        ``jax.default_matmul_precision`` asks for full float32 (``tf32`` overrides the guess).
    bfloat16/float16: judged as FlashAttention's authors do: the path's relative L2
        error against float64 must be at most ``3 x`` the error of the same computation
        carried out in that dtype (``emulate``), plus 1e-6.
    float8 paths (bf16 in and out, e4m3 inside): rel L2 <= 0.1 -- e4m3 keeps 3 mantissa bits,
        so one rounding of the output alone costs up to 6%.
    NaN or Inf anywhere in the output never passes.
Rows that see no key at all (every key masked) are given 0 here.
"""
from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np

from .spec import prepare

_LOW = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _np(x, dtype=np.float64):
    return None if x is None else np.asarray(x).astype(dtype)


def _visible(T, S, B, is_causal, window, mask, kv_lengths, offset=0):
    """Bool (B or 1, N or 1, T, S): True where query t (at position offset + t) may attend key s."""
    t = offset + np.arange(T)[:, None]
    s = np.arange(S)[None, :]
    vis = np.ones((T, S), bool)
    if is_causal:
        vis &= s <= t
    if window is not None:
        vis &= (t - s <= window[0]) & (s - t <= window[1])
    vis = vis[None, None]
    if mask is not None:
        vis = vis & np.asarray(mask, bool)
    if kv_lengths is not None:
        kv = np.asarray(kv_lengths).reshape(B, 1, 1, 1)
        vis = vis & (np.arange(S).reshape(1, 1, 1, S) < kv)
    return vis


def _round(x, low):
    return x if low is None else x.astype(low).astype(np.float64)


@dataclasses.dataclass
class _Forward:
    probs: np.ndarray      # (B, N, T, S)
    out: np.ndarray        # (B, T, N, H), padded query rows zeroed
    q: np.ndarray
    k: np.ndarray          # expanded to N heads: (B, S, N, H)
    v: np.ndarray
    scale: float
    q_keep: np.ndarray     # (B, T) bool
    head_of: np.ndarray    # query head -> key/value head
    out_shape: tuple


def _forward(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
             query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
             emulate=None, query_offset=0) -> _Forward:
    p = prepare(query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
                local_window_size=local_window_size)
    sp = p.spec
    low = _LOW.get(np.dtype(emulate).name) if emulate is not None else None
    B, T, N, S, K = sp.batch, sp.q_len, sp.heads, sp.kv_len, sp.kv_heads
    q = _round(_np(p.query), low)
    k = _round(_np(p.key), low)
    v = _round(_np(p.value), low)
    head_of = np.arange(N) // (N // K)          # query head n reads key/value head n // G
    kN, vN = k[:, :, head_of, :], v[:, :, head_of, :]
    sc = float(p.scale)
    logits = _round(np.einsum("btnh,bsnh->bnts", q, kN, optimize=True), low) * sc
    if p.bias is not None:
        logits = logits + _np(p.bias)
    vis = np.broadcast_to(_visible(T, S, B, sp.is_causal, sp.window, p.mask, p.kv_lengths, query_offset), (B, N, T, S))
    logits = np.where(vis, logits, -np.inf)
    row_max = logits.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    w = np.where(vis, np.exp(logits - row_max), 0.0)
    denom = w.sum(axis=-1, keepdims=True)
    probs = w / np.where(denom == 0, 1.0, denom)
    if low is not None:
        probs = probs.astype(np.float32).astype(low).astype(np.float64)
    out = _round(np.einsum("bnts,bsnh->btnh", probs, vN, optimize=True), low)
    q_keep = np.ones((B, T), bool)
    if p.q_lengths is not None:
        q_keep = np.arange(T)[None, :] < np.asarray(p.q_lengths).reshape(B, 1)
    out = out * q_keep[:, :, None, None]
    return _Forward(probs, out, q, kN, vN, sc, q_keep, head_of, p.out_shape)


def reference_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                        query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                        implementation=None, emulate=None, query_offset=0) -> np.ndarray:
    """Float64 attention with ``attnlab.attention``'s semantics; ``implementation`` is ignored.

    ``query_offset``: the given query rows sit at positions offset, offset+1, ... of a longer
    sequence (for checking a slice of rows of a large problem; no query_seq_lengths then).
    """
    del implementation
    if query_offset and query_seq_lengths is not None:
        raise ValueError("query_offset cannot be combined with query_seq_lengths")
    f = _forward(query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                 query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
                 local_window_size=local_window_size, emulate=emulate, query_offset=query_offset)
    return f.out.reshape(f.out_shape)


def reference_attention_grads(query, key, value, cotangent, bias=None, mask=None, *, scale=None,
                              is_causal=False, query_seq_lengths=None, key_value_seq_lengths=None,
                              local_window_size=None):
    """(dq, dk, dv) in float64 for the loss sum(out * cotangent), by the analytic backward pass."""
    f = _forward(query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                 query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
                 local_window_size=local_window_size)
    B, T, N, H = f.out.shape
    dout = _np(cotangent).reshape(B, T, N, H) * f.q_keep[:, :, None, None]
    dv_n = np.einsum("bnts,btnh->bsnh", f.probs, dout, optimize=True)
    dprobs = np.einsum("btnh,bsnh->bnts", dout, f.v, optimize=True)
    dlogits = f.probs * (dprobs - np.sum(dprobs * f.probs, axis=-1, keepdims=True))
    dq = np.einsum("bnts,bsnh->btnh", dlogits, f.k, optimize=True) * f.scale
    dk_n = np.einsum("bnts,btnh->bsnh", dlogits, f.q, optimize=True) * f.scale
    K = int(np.asarray(key).shape[-2])
    dk = np.zeros(dk_n.shape[:2] + (K, H))
    dv = np.zeros_like(dk)
    np.add.at(dk, (slice(None), slice(None), f.head_of), dk_n)
    np.add.at(dv, (slice(None), slice(None), f.head_of), dv_n)
    return dq.reshape(np.shape(query)), dk.reshape(np.shape(key)), dv.reshape(np.shape(value))


def low_precision_baseline(query, key, value, *args, ref, emulate, **kwargs) -> float:
    """Relative L2 error of the same computation carried out in ``emulate`` (bf16/fp16) against ``ref``."""
    return rel_l2(reference_attention(query, key, value, *args, emulate=emulate, **kwargs), ref)


def rel_l2(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (inf when out has NaN/Inf)."""
    out = np.asarray(out).astype(np.float64)
    ref = np.asarray(ref).astype(np.float64)
    if not np.all(np.isfinite(out)):
        return math.inf
    denom = np.linalg.norm(ref)
    num = np.linalg.norm(out - ref)
    return float(num / denom) if denom > 0 else float(num)


@dataclasses.dataclass(frozen=True)
class Verdict:
    ok: bool
    rel_err: float
    limit: float
    max_abs_err: float
    rule: str

    def __bool__(self) -> bool:
        return self.ok


def default_matmul_is_tf32() -> bool:
    """True when JAX's float32 matmuls on the default device run in TF32 (GPU, default precision)."""
    import jax

    if jax.default_backend() != "gpu":
        return False
    prec = jax.config.jax_default_matmul_precision
    return prec is None or str(prec).lower() in ("default", "bfloat16", "tensorfloat32", "fastest")


def tolerance(dtype, *, baseline_err: float | None = None, tf32: bool | None = None) -> tuple[float, str]:
    """(limit on relative L2 error, the rule in words) for outputs of ``dtype``."""
    name = np.dtype(dtype).name
    if name in ("float32", "float64"):
        if tf32 is None:
            tf32 = default_matmul_is_tf32()
        if tf32 and name == "float32":
            return 2e-3, "float32 with TF32 matmuls (GPU default precision): rel L2 <= 2e-3"
        return 1e-5, f"{name}: rel L2 <= 1e-05"
    if baseline_err is None:
        raise ValueError(f"{name} tolerance needs baseline_err: the error of the computation emulated in {name}")
    limit = 3.0 * baseline_err + 1e-6
    return limit, f"{name}: rel L2 <= 3 x {baseline_err:.2e} (same computation in {name}) + 1e-6"


def check_close(out, query, key, value, *args, tf32: bool | None = None, ref=None, limit: float | None = None,
                rule: str | None = None, baseline_err: float | None = None, **kwargs) -> Verdict:
    """Judge ``out`` against the float64 reference for these inputs by the tolerance policy.

    ``limit`` (with ``rule``, its words) replaces the dtype policy: FP8 paths use it. ``ref`` and
    ``baseline_err`` may be passed in when already computed for these inputs.
    """
    if ref is None:
        ref = reference_attention(query, key, value, *args, **kwargs)
    dtype = np.asarray(out).dtype if not hasattr(out, "dtype") else out.dtype
    if limit is None:
        if baseline_err is None and np.dtype(dtype).name in _LOW:
            baseline_err = low_precision_baseline(query, key, value, *args, ref=ref, emulate=dtype, **kwargs)
        limit, rule = tolerance(dtype, baseline_err=baseline_err, tf32=tf32)
    err = rel_l2(out, ref)
    o = np.asarray(out).astype(np.float64)
    max_abs = float(np.max(np.abs(o - ref))) if o.size else 0.0
    return Verdict(ok=bool(err <= limit), rel_err=err, limit=limit, max_abs_err=max_abs, rule=rule)
