"""What one attention call costs: FLOPs and bytes in the FlashAttention convention.

Forward FLOPs = 4 * N * H * (computed (t, s) pairs summed over the batch): two matmuls
(QK^T and PV) of 2 FLOPs per multiply-add. Only the pairs the call computes count, exactly
(``attnlab.core.pairs``): causal masks, windows, padding (``q_lengths``, ``kv_lengths``) and packed
documents (``doc_lengths``: a query sees only keys of its own document) leave the rest out (about half
for causal with T = S; about 1/n of that for n documents of equal length). Query heads are counted
(GQA does the same arithmetic as MHA). Backward = 2.5 x forward.
Bytes (forward) = q, k, v read once + the output written once; only the query rows that see a key and
the keys some query sees are counted as read (the bytes a kernel that reads no padding must move).
Bytes (backward) = q, k, v, out, d_out read once (the same rule) + dq, dk, dv written once, whole.
Decode (``decode=True``): the T queries are the last T tokens of each sequence of kv_lengths[b]
tokens (query t at position kv_lengths[b] - T + t; causal means keys at or before it).

``Workload`` is an ``attnlab.core.problem.Problem`` (its fields, validation, label and counts) with the
per-batch-element valid lengths and the decode flag on top.
"""
from __future__ import annotations

import dataclasses

from . import pairs, segments
from .problem import BWD_FLOP_FACTOR, Problem, _mode, itemsize as _itemsize  # noqa: F401  (re-exported)


@dataclasses.dataclass(frozen=True)
class Workload(Problem):
    """One attention problem. Lengths are per-batch-element valid lengths (None = full)."""

    q_lengths: tuple[int, ...] | None = None
    kv_lengths: tuple[int, ...] | None = None
    decode: bool = False
    #: packed rows (T == S): each row's contiguous documents' lengths in order, shared by queries and
    #: keys (``segments.docs``); tokens past a row's sum are padding (segment id -1)
    doc_lengths: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self):
        super().__post_init__()
        for name, lens, limit in (("q_lengths", self.q_lengths, self.q_len), ("kv_lengths", self.kv_lengths, self.kv_len)):
            if lens is not None and (len(lens) != self.batch or min(lens) < 0 or max(lens) > limit):
                raise ValueError(f"{name} must hold {self.batch} values in [0, {limit}], got {lens!r}")
        if self.decode and self.kv_lengths is not None and min(self.kv_lengths) < self.q_len:
            raise ValueError(f"decode: every kv_lengths value must be >= q_len={self.q_len} (the new tokens are in "
                             f"the cache), got {self.kv_lengths!r}")
        d = self.doc_lengths
        if d is not None:
            if self.q_len != self.kv_len or self.decode or self.q_lengths is not None or self.kv_lengths is not None:
                raise ValueError("doc_lengths (packed rows) needs q_len == kv_len, no decode and no q/kv lengths")
            if len(d) != self.batch or any(min(row, default=1) < 1 or sum(row) > self.q_len for row in d):
                raise ValueError(f"doc_lengths must hold {self.batch} rows of positive document lengths summing to "
                                 f"at most q_len={self.q_len}, got {d!r}")
            object.__setattr__(self, "doc_lengths", tuple(tuple(int(x) for x in row) for row in d))

    # --- counts -----------------------------------------------------------
    def counts(self) -> pairs.Counts:
        """Pairs, query rows and keys the call computes with (``attnlab.core.pairs``), lengths and documents included."""
        if self.doc_lengths is not None:
            return pairs.doc_counts([n for row in self.doc_lengths for n in row],
                                    *pairs.band(self.causal, self.window, 2 * self.q_len + 1))
        return pairs.count(self.q_len, self.kv_len, causal=self.causal, window=self.window,
                           q_lengths=self.q_lengths or (self.q_len,) * self.batch,
                           kv_lengths=self.kv_lengths or (self.kv_len,) * self.batch, decode=self.decode)

    def kv_bytes(self) -> int:
        """Bytes of the key and value caches a forward pass reads (decode: valid lengths only)."""
        return 2 * self.kv_tokens() * self.kv_heads * self.head_dim * self.itemsize

    def kv_cache_bytes_per_token(self) -> int:
        """Bytes of key + value cache one token costs in one layer."""
        return 2 * self.kv_heads * self.head_dim * self.itemsize

    @classmethod
    def from_problem(cls, problem: Problem, **extra) -> "Workload":
        return cls(**{f: getattr(problem, f) for f in Problem.__dataclass_fields__}, **extra)

    @classmethod
    def from_spec(cls, spec) -> "Workload":
        return cls.from_problem(spec.problem)

    @classmethod
    def from_segment_ids(cls, problem: Problem, segment_ids) -> "Workload":
        """A packed self-attention problem from its (B, T) segment ids (contiguous documents, ids >= 0;
        negative ids are padding): ``doc_lengths`` read off the ids' runs."""
        return cls.from_problem(problem, doc_lengths=segments.run_lengths(segment_ids))


def kv_cache_bytes(*, layers: int, kv_heads: int, head_dim: int, context: int, batch: int = 1,
                   dtype: str = "bfloat16") -> int:
    """Bytes of key + value cache for a model: 2 * layers * kv_heads * head_dim * itemsize per token."""
    return 2 * layers * kv_heads * head_dim * _itemsize(dtype) * context * batch
