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
naming the argument, before JAX sees the arrays. It returns the call (``attnlab.core.call.Call``): the
arrays normalised to 4-D (B,T,N,H), (B,S,K,H), bias/mask (.,.,.,.), (B,) int lengths, and the static
facts a backend needs to decide whether it can run it. The rules it shares with ``decode_attention`` (sizes:
``Problem``'s own; dtypes, key/value shapes, flags, lengths, scale, soft cap, window)
live in ``attnlab.core.checks`` (re-exported here).
"""
from __future__ import annotations

import math

import numpy as np

from .names import FLOAT_DTYPES
from . import segments
from .checks import (_check_lengths, _is_tracer, _shape, as_lengths, broadcast_operand, call_problem, check_flag,
                     check_kv_shapes, check_scale, check_sinks, check_soft_cap, common_float_dtype, normalise_window,
                     to_rank)
from .call import Call
from .problem import Problem

#: How ``attention``'s errors name the sizes of a call (``checks.call_problem``).
ARGUMENT_NAMES = {"batch": "query batch size B", "q_len": "query length T", "kv_len": "key length S",
                  "heads": "query heads N", "kv_heads": "key/value heads K", "head_dim": "head dim H"}
#: The sizes jax.nn lets be 0 (an empty call: ``prepare(..., allow_empty=True)``). K = 0 stays an error
#: (jax.nn's too), and so does H = 0 (jax.nn runs it with the scale 1/sqrt(0)).
EMPTY_SIZES = ("batch", "q_len", "kv_len", "heads")


def AttentionSpec(batch=None, q_len=None, kv_len=None, heads=None, kv_heads=None, head_dim=None, dtype=None,
                  scale=None, is_causal=False, bias_shape=None, mask_shape=None, has_q_lengths=False,
                  has_kv_lengths=False, window=None, return_residual=False, soft_cap=None, has_segment_ids=False,
                  max_segments=None, segments_contiguous=None, has_sinks=False, *, problem: Problem | None = None) -> Call:
    """The static ``Call`` of an attention call, in the argument order of the type it replaces (kept for one
    release): ``AttentionSpec(batch=, q_len=, ..., dtype=, scale=, is_causal=, window=, ...)`` or ``problem=``."""
    if problem is None:
        problem = Problem(batch, q_len, kv_len, heads, kv_heads, head_dim, dtype, bool(is_causal), window)
    return Call(problem, scale, bias_shape=bias_shape, mask_shape=mask_shape, has_q_lengths=has_q_lengths,
                has_kv_lengths=has_kv_lengths, return_residual=return_residual, soft_cap=soft_cap,
                has_segment_ids=has_segment_ids, max_segments=max_segments, segments_contiguous=segments_contiguous,
                has_sinks=bool(has_sinks))


#: The checked call with its arrays: a ``Call`` (the name kept for one release).
Prepared = Call


def prepare(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
            query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
            return_residual=False, logits_soft_cap=None, query_segment_ids=None,
            key_value_segment_ids=None, sinks=None, allow_empty=False) -> Call:
    """Check every argument of an attention call and normalise it. See the module docstring.

    ``allow_empty``: B, T, S or N may be 0, as in jax.nn (``attention`` and the reference answer such a
    call without a kernel); every other rule still holds, and the result's ``spec`` is None."""
    qs, ks, vs = _shape("query", query), _shape("key", key), _shape("value", value)
    for name, shape in (("query", qs), ("key", ks), ("value", vs)):   # each alone, as jax.nn: (T, N, H) is B = 1
        if not 1 <= len(shape) <= 4:
            raise ValueError(f"{name} must have rank 4 (B, T, N, H) or 3 (T, N, H) (fewer: leading sizes of 1), "
                             f"got shape {shape}")
    q4, k4, v4 = to_rank(query, 4), to_rank(key, 4), to_rank(value, 4)
    check_kv_shapes(("query", "key", "value"), *(tuple(int(d) for d in x.shape) for x in (q4, k4, v4)))
    dtype = common_float_dtype({"query": query, "key": key, "value": value})
    B, T, N, H = (int(d) for d in q4.shape)
    S, K = (int(d) for d in k4.shape[1:3])
    window = normalise_window(local_window_size)
    problem = call_problem(ARGUMENT_NAMES, (B, T, S, N, K, H), dtype, check_flag("is_causal", is_causal), window,
                           may_be_empty=EMPTY_SIZES if allow_empty else ())
    bias = broadcast_operand("bias", bias, (B, N, T, S))
    mask = broadcast_operand("mask", mask, (B, N, T, S))
    bias_shape, mask_shape = (None if x is None else tuple(int(d) for d in x.shape) for x in (bias, mask))
    query_seq_lengths, key_value_seq_lengths = as_lengths(query_seq_lengths), as_lengths(key_value_seq_lengths)
    if query_seq_lengths is not None:
        _check_lengths("query_seq_lengths", query_seq_lengths, B, T, "T")
    if key_value_seq_lengths is not None:
        _check_lengths("key_value_seq_lengths", key_value_seq_lengths, B, S, "S")
    return_residual = check_flag("return_residual", return_residual)
    scale = check_scale(scale)
    soft_cap = check_soft_cap(logits_soft_cap)
    if len(qs) < 4:    # an unbatched call takes (T,) and (S,) ids
        query_segment_ids, key_value_segment_ids = (to_rank(x, 2) if hasattr(x, "shape") and len(x.shape) == 1 else x
                                                    for x in (query_segment_ids, key_value_segment_ids))
    segments.check_segment_ids(query_segment_ids, key_value_segment_ids, B, T, S)
    sinks = check_sinks(sinks, N)
    effective_scale = 1.0 / math.sqrt(H) if scale is None else scale
    arrays = dict(query=q4, key=k4, value=v4, bias=bias, mask=mask, q_lengths=query_seq_lengths,
                  kv_lengths=key_value_seq_lengths, q_segment_ids=query_segment_ids,
                  kv_segment_ids=key_value_segment_ids, sinks=sinks, out_shape=qs)
    if problem is None:
        return Call(None, effective_scale, **arrays)
    most = contiguous = None
    if query_segment_ids is not None and not (_is_tracer(query_segment_ids) or _is_tracer(key_value_segment_ids)):
        (mq, cq), (mk, ck) = segments.host_layout(query_segment_ids), segments.host_layout(key_value_segment_ids)
        most, contiguous = max(mq, mk), cq and ck
    return Call(problem, effective_scale, scale_is_static=not _is_tracer(effective_scale),
                bias_shape=bias_shape, mask_shape=mask_shape,
                has_q_lengths=query_seq_lengths is not None, has_kv_lengths=key_value_seq_lengths is not None,
                return_residual=return_residual, soft_cap=soft_cap, has_segment_ids=query_segment_ids is not None,
                max_segments=most, segments_contiguous=contiguous, has_sinks=sinks is not None, **arrays)
