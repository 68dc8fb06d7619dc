"""The truth for decode attention: NumPy float64, written apart from JAX and from ``reference.py``'s masks.

``reference_decode_attention(q, k_cache, v_cache, kv_lengths, causal=..., scale=...)`` returns
a float64 (B, T, N, H) array with ``attnlab.decode_attention``'s semantics: query t of batch b
sits at position p = kv_lengths[b] - T + t; causal: it sees keys <= p, else every key
< kv_lengths[b]; ``local_window_size`` (w or (left, right)): only keys in [p - left, p + right] too.

``emulate=dtype`` (bf16/fp16) carries out the computation the way a flash-decoding kernel does:
scores in float32, softmax numerator P = exp(s - max) in float32 and rounded to the dtype before
P.V, float32 accumulation, division by the float32 sum, output rounded to the dtype. Its error
against float64 is the baseline of the decode tolerance policy (``check_decode_close``).

The decode rule of the tolerance policy (docs/measuring.md, "Tolerance policy") is coded once,
in ``decode_tolerance`` (``DECODE_FACTOR``, ``DECODE_FLOOR``).
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from . import rules
from .dequant64 import dequantized_cache64
from .float64 import Verdict, rel_l2, tolerance
from .tolerance import TF32_LIMIT, policy_limit, row_rel_err
from ..core.checks import check_soft_cap
from ..core.kv_quant import check_kv_scales

_LOW = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
DECODE_FACTOR = 2.0
DECODE_FLOOR = 1e-5


def decode_visible(kv_lengths, q_len: int, max_len: int, causal: bool, window=None) -> np.ndarray:
    """Bool (B, T, S): True where query t of batch b may attend key s (``window``: (left, right) or None)."""
    lengths = np.asarray(kv_lengths).astype(np.int64).reshape(-1, 1, 1)
    s = np.arange(max_len).reshape(1, 1, -1)
    vis = s < lengths
    q_pos = lengths - q_len + np.arange(q_len).reshape(1, -1, 1)
    if causal:
        vis = vis & (s <= q_pos)
    if window is not None:
        left, right = window
        vis = vis & (q_pos - left <= s) & (s <= q_pos + right)
    return vis


def _window(local_window_size):
    """jax.nn's reading of ``local_window_size``: w -> (w, w), (left, right) as given, None."""
    if local_window_size is None:
        return None
    if np.ndim(local_window_size) == 0:
        return (int(local_window_size),) * 2
    left, right = (int(x) for x in local_window_size)
    return left, right


def _f32(x):
    return x.astype(np.float32).astype(np.float64)


def dequantized64(k_cache, v_cache, k_scale=None, v_scale=None):
    """(k, v) as float64 contiguous caches (B, S_max, K, H): a quantized cache (``attnlab.core.kv_quant``:
    scales () per tensor, (K,) per KV head or (B, S_max, K) per token) dequantized in float64."""
    if k_scale is None and v_scale is None:
        return tuple(np.asarray(x).astype(np.float64) for x in (k_cache, v_cache))
    check_kv_scales(k_cache, v_cache, k_scale, v_scale, paged=False)       # the call's rules: the scales fit
    return tuple(dequantized_cache64(c, s) for c, s in ((k_cache, k_scale), (v_cache, v_scale)))


def reference_decode_attention(q, k_cache, v_cache, kv_lengths, *, causal=True, scale=None, emulate=None,
                               implementation=None, logits_soft_cap=None, sinks=None,
                               local_window_size=None, k_scale=None, v_scale=None) -> np.ndarray:
    """Float64 decode attention (see the module docstring); ``implementation`` is ignored.
    ``logits_soft_cap``: logits -> cap * tanh(logits / cap) before masking. ``sinks`` (N,): one more
    logit per query head in the softmax denominator, with no value. ``k_scale``/``v_scale``: a quantized
    contiguous cache's scales (``dequantized64``); the cache is dequantized in float64 first."""
    del implementation
    k, v = dequantized64(k_cache, v_cache, k_scale, v_scale)
    return _attention64(q, k, v, kv_lengths, causal=causal, scale=scale, emulate=emulate,
                        logits_soft_cap=logits_soft_cap, sinks=sinks, local_window_size=local_window_size)


def _attention64(q, k, v, kv_lengths, *, causal=True, scale=None, emulate=None, logits_soft_cap=None, sinks=None,
                 local_window_size=None) -> np.ndarray:
    """``reference_decode_attention`` of contiguous caches k, v (B, S_max, K, H) that are not quantized."""
    q, k, v = (np.asarray(x).astype(np.float64, copy=False) for x in (q, k, v))
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"q must be (B, T, N, H) and k_cache, v_cache (B, S_max, K, H), got {q.shape}, {k.shape}, {v.shape}")
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    lengths = np.asarray(kv_lengths)
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"kv_lengths must be integers, got dtype {lengths.dtype.name}")
    lengths = lengths.astype(np.int64)
    if lengths.shape != (B,) or np.any(lengths < T) or np.any(lengths > S):
        raise ValueError(f"kv_lengths must be (B,)=({B},) with T={T} <= kv_lengths[b] <= S_max={S}, got {lengths.tolist()}")
    past = (np.arange(S) >= lengths[:, None])[:, :, None, None]    # the cache's padding: never attended, whatever it holds
    k, v = np.where(past, 0.0, k), np.where(past, 0.0, v)
    low = _LOW.get(np.dtype(emulate).name) if emulate is not None else None
    sc = 1.0 / math.sqrt(H) if scale is None else float(scale)
    G = N // K
    qg = q.reshape(B, T, K, G, H)
    logits = np.einsum("btkgh,bskh->bkgts", qg, k, optimize=True)
    if low is not None:
        logits = _f32(_f32(logits) * np.float32(sc))
    else:
        logits = logits * sc
    if logits_soft_cap is not None:
        cap = check_soft_cap(logits_soft_cap)
        logits = cap * np.tanh(logits / cap)
        if low is not None:
            logits = _f32(logits)
    vis = decode_visible(lengths, T, S, causal, _window(local_window_size))[:, None, None]   # (B, 1, 1, T, S)
    logits = np.where(vis, logits, -np.inf)
    m = logits.max(axis=-1, keepdims=True)
    sink = None if sinks is None else np.asarray(sinks, np.float64).reshape(1, K, G, 1, 1)
    if sink is not None:
        m = np.maximum(m, sink)
    w = np.where(vis, np.exp(logits - m), 0.0)
    denom = w.sum(axis=-1, keepdims=True) + (0.0 if sink is None else np.exp(sink - m))
    if low is not None:
        w, denom = _f32(w), _f32(denom)
        num = _f32(np.einsum("bkgts,bskh->btkgh", w.astype(low).astype(np.float64), v, optimize=True))
        out = num / np.moveaxis(denom, (1, 2, 3), (2, 3, 1))
        out = out.astype(np.float32).astype(low).astype(np.float64)
    else:
        out = np.einsum("bkgts,bskh->btkgh", w / denom, v, optimize=True)
    return out.reshape(B, T, N, H)


def decode_tolerance(dtype, *, baseline_err: float | None = None, tf32: bool | None = None) -> tuple[float, str]:
    """(limit on relative L2 error, the rule in words) for decode outputs of ``dtype``."""
    name = np.dtype(dtype).name
    if name not in _LOW:
        return tolerance(dtype, tf32=tf32)
    if baseline_err is None:
        raise ValueError(f"{name} tolerance needs baseline_err: the error of the kernel-like emulation in {name}")
    limit = DECODE_FACTOR * baseline_err + DECODE_FLOOR
    return limit, (f"{name}: rel L2 <= {DECODE_FACTOR:g} x {baseline_err:.2e} (kernel-like emulation in {name}) "
                   f"+ {DECODE_FLOOR:g}")


def check_decode_close(out, q, k_cache, v_cache, kv_lengths, *, causal=True, scale=None, ref=None,
                       tf32: bool | None = None, logits_soft_cap=None, sinks=None, local_window_size=None,
                       k_scale=None, v_scale=None) -> Verdict:
    """Judge a decode output against float64 by the decode tolerance policy (whole output).

    ``out`` must be one array of ``q``'s exact shape and dtype, as ``attnlab.decode_attention`` returns
    it (else ``OutputMismatchError``, ``attnlab.reference.rules``). Every decode row sees a key
    (kv_lengths[b] >= T), so the empty-row rule never applies here. A quantized contiguous cache
    (``k_scale``/``v_scale``) is judged on its values dequantized in float64 (``dequantized64``)."""
    k, v = dequantized64(k_cache, v_cache, k_scale, v_scale)
    return _verdict(out, q, k, v, kv_lengths, ref=ref, tf32=tf32, causal=causal, scale=scale,
                    logits_soft_cap=logits_soft_cap, sinks=sinks, local_window_size=local_window_size)


def dequantized_errors(out, q, k_dequantized, v_dequantized, k, v, kv_lengths, **kw) -> tuple[Verdict, float]:
    """A quantized cache's check: (``check_decode_close``'s verdict on ``out`` against float64 of the dequantized
    cache, the same output's rel L2 error against float64 of the unquantized ``k``, ``v``: what the quantization
    costs). Caches (B, S_max, K, H), the dequantized ones in float64; ``kw``: ``check_decode_close``'s semantics."""
    verdict = _verdict(out, q, k_dequantized, v_dequantized, kv_lengths, **kw)
    return verdict, rel_l2(out, _attention64(q, k, v, kv_lengths, **kw))


def _verdict(out, q, k, v, kv_lengths, *, ref=None, tf32=None, **kw) -> Verdict:
    """``check_decode_close`` of caches that are not quantized."""
    rules.require_like(out, "out", np.shape(q), q.dtype if hasattr(q, "dtype") else np.asarray(q).dtype,
                       "q's: (B, T, N, H)")
    if ref is None:
        ref = _attention64(q, k, v, kv_lengths, **kw)
    dtype = np.dtype(out.dtype)
    baseline = row_limit = None
    if dtype.name in _LOW:
        emu = _attention64(q, k, v, kv_lengths, emulate=dtype, **kw)
        baseline, row_limit = rel_l2(emu, ref), policy_limit(dtype, row_rel_err(emu, ref))
    limit, rule = decode_tolerance(dtype, baseline_err=baseline, tf32=tf32)
    # the worst row (one query of one sequence, every head) as ``check_close`` judges it: one wrong row among many
    row_limit = limit * (10 if limit == TF32_LIMIT else 1) if row_limit is None else row_limit
    err, row = rel_l2(out, ref), row_rel_err(out, ref)
    o = np.asarray(out).astype(np.float64)
    max_abs = float(np.max(np.abs(o - ref))) if o.size else 0.0
    return Verdict(ok=bool(err <= limit and row <= row_limit), rel_err=err, limit=limit, max_abs_err=max_abs,
                   rule=f"{rule}; worst row <= {row_limit:.2e}", row_err=row, row_limit=row_limit)
