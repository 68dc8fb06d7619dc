"""What one attention call costs: FLOPs and bytes in the FlashAttention convention (``Problem.flops``/``bytes``).

Forward FLOPs = 4 * N * H * (computed (t, s) pairs summed over the batch): two matmuls
(QK^T and PV) of 2 FLOPs per multiply-add. Only the pairs the call computes count, exactly
(``attnlab.core.pairs``): causal masks, windows, padding (``q_lengths``, ``kv_lengths``) and packed
documents (``doc_lengths``: a query sees only keys of its own document) leave the rest out (about half
for causal with T = S; about 1/n of that for n documents of equal length). Query heads are counted
(GQA does the same arithmetic as MHA). Backward = 2.5 x forward.
Bytes (forward) = q, k, v read once + the output written once; only the query rows that see a key and
the keys some query sees are counted as read (the bytes a kernel that reads no padding must move).
Bytes (backward) = q, k, v, out, d_out read once (the same rule) + dq, dk, dv written once, whole.
Decode (``decode=True``): request b's q_lengths[b] (default T) queries are the last tokens of its
kv_lengths[b] tokens (query t at position kv_lengths[b] - q_lengths[b] + t; causal means keys at or before
it); only the new tokens' output rows are written (a serving step's bytes, ``attnlab.core.serving_cost``).

The model is ``attnlab.core.problem.Problem``'s own methods; ``Workload`` is the Problem (its old name, kept
for callers), and what is not a method is a function here.
"""
from __future__ import annotations

import dataclasses

from . import segments
from .problem import BWD_FLOP_FACTOR, Problem, _mode, itemsize as _itemsize  # noqa: F401  (re-exported)

#: The cost model's old name: a ``Problem`` (with its lengths, decode flag and documents).
Workload = Problem


def with_segment_ids(problem: Problem, segment_ids) -> Problem:
    """A packed self-attention problem from its (B, T) segment ids (contiguous documents, ids >= 0;
    negative ids are padding): ``doc_lengths`` read off the ids' runs."""
    return dataclasses.replace(problem, doc_lengths=segments.run_lengths(segment_ids))


def kv_cache_bytes(*, layers: int, kv_heads: int, head_dim: int, context: int, batch: int = 1,
                   dtype: str = "bfloat16", kv_scale: str | None = None) -> int:
    """Bytes of key + value cache for a model: 2 * layers * kv_heads * head_dim * itemsize per token, plus
    2 * layers * kv_heads float32 scales per token for a quantized (1-byte) cache with ``kv_scale="token"``."""
    if kv_scale is not None and _itemsize(dtype) != 1:
        raise ValueError(f"kv_scale {kv_scale!r} needs a quantized (1-byte) dtype, got {dtype}")
    per_token = 2 * layers * kv_heads * (head_dim * _itemsize(dtype) + (4 if kv_scale == "token" else 0))
    return per_token * context * batch
