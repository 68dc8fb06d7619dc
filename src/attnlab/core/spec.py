"""Input checking and the description of one attention call.

Shape letters, used throughout attnlab (as in ``jax.nn.dot_product_attention``):

    B  batch size
    T  query (target) length
    S  key/value (source) length
    N  query heads
    K  key/value heads; K divides N. Query head n reads key/value head n // (N // K)
    H  head dim

query is (B, T, N, H) or (T, N, H); key and value are (B, S, K, H) or (S, K, H).
bias and mask broadcast to (B, N, T, S); mask is bool with True = attend.

``prepare`` checks every rule up front and raises ``ValueError``/``TypeError``
naming the argument, before JAX sees the arrays. It returns the arrays normalised
to 4-D plus an ``AttentionSpec``: the static facts a backend needs to decide
whether it can run the call.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np

from .names import FLOAT_DTYPES
from . import segments
from .problem import Problem, delegate_fields


@dataclasses.dataclass(frozen=True, init=False)
class AttentionSpec:
    """Static description of one attention call: its ``Problem`` (shapes, dtype, causal, window)
    and what else the call carries (scale, bias/mask shapes, lengths, return_residual).

    Built as before, ``AttentionSpec(batch=, q_len=, ..., dtype=, scale=, is_causal=, window=, ...)``
    (or with ``problem=``); the problem's fields read as attributes (``spec.heads``, ``spec.is_causal``)."""

    problem: Problem
    scale: float | None
    bias_shape: tuple[int, ...] | None = None
    mask_shape: tuple[int, ...] | None = None
    has_q_lengths: bool = False
    has_kv_lengths: bool = False
    return_residual: bool = False   # also return the (B, T, N) logsumexp, as jax.nn's return_residual
    soft_cap: float | None = None   # logits_soft_cap: logits -> cap * tanh(logits / cap) before masking
    has_segment_ids: bool = False   # query_segment_ids / key_value_segment_ids given (packed rows)
    #: with concrete segment ids: the most segments in a row (query or key side) and whether every row's
    #: segments are contiguous; None when the ids are traced (unknown until run)
    max_segments: int | None = None
    segments_contiguous: bool | None = None

    def __init__(self, batch=None, q_len=None, kv_len=None, heads=None, kv_heads=None, head_dim=None, dtype=None,
                 scale=None, is_causal=False, bias_shape=None, mask_shape=None, has_q_lengths=False,
                 has_kv_lengths=False, window=None, return_residual=False, soft_cap=None, has_segment_ids=False,
                 max_segments=None, segments_contiguous=None, *, problem: Problem | None = None):
        if problem is None:
            problem = Problem(batch, q_len, kv_len, heads, kv_heads, head_dim, dtype, bool(is_causal), window)
        for name, value in (("problem", problem), ("scale", scale), ("bias_shape", bias_shape),
                            ("mask_shape", mask_shape), ("has_q_lengths", has_q_lengths),
                            ("has_kv_lengths", has_kv_lengths), ("return_residual", return_residual),
                            ("soft_cap", soft_cap), ("has_segment_ids", has_segment_ids),
                            ("max_segments", max_segments), ("segments_contiguous", segments_contiguous)):
            object.__setattr__(self, name, value)

    @property
    def groups(self) -> int:
        return self.problem.groups


delegate_fields(AttentionSpec, is_causal="causal")


@dataclasses.dataclass
class Prepared:
    """Arrays normalised to 4-D (B,T,N,H), (B,S,K,H), bias/mask (.,.,.,.) and int32 lengths."""

    query: Any
    key: Any
    value: Any
    bias: Any
    mask: Any
    q_lengths: Any
    kv_lengths: Any
    spec: AttentionSpec
    out_shape: tuple[int, ...]
    scale: Any  # the logits' scale: a float, or a tracer when scale was traced
    q_segment_ids: Any = None    # (B, T) ints or None
    kv_segment_ids: Any = None   # (B, S) ints or None


def _dtype_name(x) -> str:
    """The dtype JAX computes ``x`` in: a NumPy float64 array is float32 to JAX unless x64 is on."""
    name = np.dtype(x.dtype).name
    if name == "float64":
        import jax

        return np.dtype(jax.dtypes.canonicalize_dtype(x.dtype)).name
    return name


def _is_tracer(x) -> bool:
    try:
        import jax

        return isinstance(x, jax.core.Tracer)
    except Exception:  # pragma: no cover - jax always importable in practice
        return False


def _shape(name: str, x) -> tuple[int, ...]:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be an array with .shape and .dtype, got {type(x).__name__}")
    return tuple(int(d) for d in x.shape)


def _expand(x, ndim: int):
    """Prepend unit axes so x has ``ndim`` dims (works for NumPy and JAX arrays)."""
    missing = ndim - len(x.shape)
    return x.reshape((1,) * missing + tuple(x.shape)) if missing > 0 else x


def _check_broadcast(name: str, shape: tuple[int, ...], target: tuple[int, int, int, int]):
    if len(shape) > 4:
        raise ValueError(f"{name} must have at most 4 dims broadcastable to (B, N, T, S)={target}, got shape {shape}")
    full = (1,) * (4 - len(shape)) + shape
    for letter, got, want in zip("BNTS", full, target):
        if got not in (1, want):
            raise ValueError(
                f"{name} shape {shape} is not broadcastable to (B, N, T, S)={target}: "
                f"dim {letter} is {got}, must be 1 or {want}"
            )


def _check_lengths(name: str, x, batch: int, limit: int, letter: str):
    shape = _shape(name, x)
    if shape != (batch,):
        raise ValueError(f"{name} must have shape (B,)=({batch},), got {shape}")
    kind = np.dtype(x.dtype).kind
    if kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {np.dtype(x.dtype).name}")
    if not _is_tracer(x):
        vals = np.asarray(x)
        if vals.size and (vals.min() < 0 or vals.max() > limit):
            raise ValueError(f"{name} values must lie in [0, {letter}]=[0, {limit}], got {vals.tolist()}")


def common_float_dtype(arrays: dict[str, Any]) -> str:
    """The one floating dtype name that ``arrays`` (argument name -> array) share; TypeError naming
    the argument whose dtype is not floating, or every dtype when they differ."""
    dts = {n: _dtype_name(x) for n, x in arrays.items()}
    for n, d in dts.items():
        if d not in FLOAT_DTYPES:
            raise TypeError(f"{n} must have a floating dtype ({', '.join(FLOAT_DTYPES)}), got {d}")
    if len(set(dts.values())) != 1:
        *first, last = dts
        raise TypeError(f"{', '.join(first)} and {last} must share one dtype, got "
                        + ", ".join(f"{n} {d}" for n, d in dts.items()))
    return next(iter(dts.values()))


def check_scale(scale):
    """None, a positive finite float (a Python float from any real), or a traced scalar as given."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not (isinstance(scale, numbers.Real) or hasattr(scale, "dtype")):
        raise TypeError(f"scale must be a positive finite float or None, got {scale!r}")
    if _is_tracer(scale):
        return scale
    s = float(scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be positive and finite, got {s}")
    return s


def normalise_window(local_window_size) -> tuple[int, int] | None:
    """None, an int w (meaning (w, w)) or (left, right) with non-negative ints."""
    if local_window_size is None:
        return None
    def ok(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)
    if ok(local_window_size):
        w = int(local_window_size)
        if w < 0:
            raise ValueError(f"local_window_size must be >= 0, got {w}")
        return (w, w)
    if isinstance(local_window_size, (tuple, list)) and len(local_window_size) == 2 and all(map(ok, local_window_size)):
        left, right = (int(v) for v in local_window_size)
        if left < 0 or right < 0:
            raise ValueError(f"local_window_size (left, right) must both be >= 0, got {(left, right)}")
        return (left, right)
    raise ValueError(f"local_window_size must be None, an int or a (left, right) pair of ints, got {local_window_size!r}")


def prepare(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
            query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
            return_residual=False, logits_soft_cap=None, query_segment_ids=None,
            key_value_segment_ids=None) -> Prepared:
    """Check every argument of an attention call and normalise it. See the module docstring."""
    qs, ks, vs = _shape("query", query), _shape("key", key), _shape("value", value)
    if len(qs) not in (3, 4):
        raise ValueError(f"query must have rank 4 (B, T, N, H) or 3 (T, N, H), got shape {qs}")
    if len(ks) != len(qs):
        raise ValueError(f"key must have the same rank as query ({len(qs)}), got shape {ks}")
    if vs != ks:
        raise ValueError(f"value shape {vs} must equal key shape {ks}")
    dtype = common_float_dtype({"query": query, "key": key, "value": value})
    q4, k4, v4 = _expand(query, 4), _expand(key, 4), _expand(value, 4)
    B, T, N, H = (int(d) for d in q4.shape)
    kB, S, K, kH = (int(d) for d in k4.shape)
    if kB != B:
        raise ValueError(f"key batch size {kB} must equal query batch size {B}")
    if kH != H:
        raise ValueError(f"key head dim {kH} must equal query head dim {H}")
    if H == 0:
        raise ValueError("head dim H must be >= 1, got 0")
    if T == 0 or S == 0:
        raise ValueError(f"query length T and key length S must be >= 1, got T={T}, S={S}")
    if K == 0 or N % K != 0:
        raise ValueError(f"query heads N={N} must be a multiple of key/value heads K={K}")

    target = (B, N, T, S)
    bias_shape = mask_shape = None
    if bias is not None:
        bias_shape = _shape("bias", bias)
        if np.dtype(bias.dtype).name not in FLOAT_DTYPES:
            raise TypeError(f"bias must have a floating dtype, got {np.dtype(bias.dtype).name}")
        _check_broadcast("bias", bias_shape, target)
        bias = _expand(bias, 4)
        bias_shape = tuple(int(d) for d in bias.shape)
    if mask is not None:
        mask_shape = _shape("mask", mask)
        if np.dtype(mask.dtype) != np.dtype(bool):
            raise TypeError(f"mask must be bool (True = attend), got {np.dtype(mask.dtype).name}; pass additive masks as bias")
        _check_broadcast("mask", mask_shape, target)
        mask = _expand(mask, 4)
        mask_shape = tuple(int(d) for d in mask.shape)
    if query_seq_lengths is not None:
        _check_lengths("query_seq_lengths", query_seq_lengths, B, T, "T")
    if key_value_seq_lengths is not None:
        _check_lengths("key_value_seq_lengths", key_value_seq_lengths, B, S, "S")
    window = normalise_window(local_window_size)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__} {is_causal!r}")
    if not isinstance(return_residual, (bool, np.bool_)):
        raise TypeError(f"return_residual must be a bool, got {type(return_residual).__name__} {return_residual!r}")
    scale = check_scale(scale)
    soft_cap = check_soft_cap(logits_soft_cap)
    if len(qs) == 3:   # an unbatched call takes (T,) and (S,) ids
        query_segment_ids, key_value_segment_ids = (_expand(x, 2) if hasattr(x, "shape") and len(x.shape) == 1 else x
                                                    for x in (query_segment_ids, key_value_segment_ids))
    segments.check_segment_ids(query_segment_ids, key_value_segment_ids, B, T, S)
    most = contiguous = None
    if query_segment_ids is not None and not (_is_tracer(query_segment_ids) or _is_tracer(key_value_segment_ids)):
        (mq, cq), (mk, ck) = segments.host_layout(query_segment_ids), segments.host_layout(key_value_segment_ids)
        most, contiguous = max(mq, mk), cq and ck
    spec = AttentionSpec(
        batch=B, q_len=T, kv_len=S, heads=N, kv_heads=K, head_dim=H, dtype=dtype,
        scale=scale if isinstance(scale, float) or scale is None else None,
        is_causal=bool(is_causal), bias_shape=bias_shape, mask_shape=mask_shape,
        has_q_lengths=query_seq_lengths is not None, has_kv_lengths=key_value_seq_lengths is not None,
        window=window, return_residual=bool(return_residual), soft_cap=soft_cap,
        has_segment_ids=query_segment_ids is not None, max_segments=most, segments_contiguous=contiguous,
    )
    effective_scale = 1.0 / math.sqrt(H) if scale is None else scale
    return Prepared(q4, k4, v4, bias, mask, query_seq_lengths, key_value_seq_lengths, spec, qs, effective_scale,
                    query_segment_ids, key_value_segment_ids)


def check_soft_cap(cap) -> float | None:
    """None, or a positive finite Python/NumPy float (compiled in: it may not be traced)."""
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real) or _is_tracer(cap):
        raise TypeError(f"logits_soft_cap must be None or a positive finite float (a Python number, not an array), "
                        f"got {type(cap).__name__} {cap!r}")
    c = float(cap)
    if not (math.isfinite(c) and c > 0):
        raise ValueError(f"logits_soft_cap must be positive and finite (logits -> cap * tanh(logits / cap)), got {c}")
    return c
