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
    #: a quantized KV cache (``core.kv_quant``): its dtype and scale layout; K and V bytes are counted at the
    #: cache's dtype plus the scales read (``page_size``: the pages a ``page`` layout reads a scale of)
    kv_dtype: str | None = None
    kv_scale: str | None = None
    page_size: int | None = None

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
        if self.kv_dtype is not None:
            from .kv_quant import SCALE_LAYOUTS, canonical_kv_dtype

            object.__setattr__(self, "kv_dtype", canonical_kv_dtype(self.kv_dtype))
            if self.kv_scale not in SCALE_LAYOUTS or (self.kv_scale == "page" and not self.page_size):
                raise ValueError(f"kv_scale must be one of {SCALE_LAYOUTS} with kv_dtype (page: with page_size), "
                                 f"got {self.kv_scale!r}")

    # --- counts -----------------------------------------------------------
    def counts(self) -> pairs.Counts:
        """Pairs, query rows and keys the call computes with (``attnlab.core.pairs``), lengths and documents included."""
        if self.doc_lengths is not None:
            return pairs.doc_counts([n for row in self.doc_lengths for n in row],
                                    *pairs.band(self.causal, self.window, 2 * self.q_len + 1))
        return pairs.count(self.q_len, self.kv_len, causal=self.causal, window=self.window,
                           q_lengths=self.q_lengths or (self.q_len,) * self.batch,
                           kv_lengths=self.kv_lengths or (self.kv_len,) * self.batch, decode=self.decode)

    @property
    def kv_itemsize(self) -> int:
        """Bytes per element of the K/V cache: the quantized cache's dtype, else the problem's."""
        return _itemsize(self.kv_dtype) if self.kv_dtype else self.itemsize

    def kv_bytes(self) -> int:
        """Bytes of the key and value caches a forward pass reads (decode: valid lengths only), a quantized
        cache's scales included (``kv_scale_bytes``)."""
        return 2 * self.kv_tokens() * self.kv_heads * self.head_dim * self.kv_itemsize + self.kv_scale_bytes()

    def kv_scale_bytes(self) -> int:
        """Bytes of k_scale and v_scale (float32) a forward pass reads: per token of the keys it reads, per page of
        them (``page_size``), per KV head or one each; 0 for a float cache."""
        if self.kv_dtype is None:
            return 0
        K = self.kv_heads
        if self.kv_scale == "token":
            n = self.kv_tokens() * K
        elif self.kv_scale == "page":
            lens = self.kv_lengths or (self.kv_len,) * self.batch
            n = sum(-(-int(x) // self.page_size) for x in lens) * K
        else:
            n = K if self.kv_scale == "head" else 1
        return 2 * 4 * n

    def bytes(self, mode: str = "fwd") -> float:
        """``Problem.bytes``; a quantized cache (forward only) reads K and V at its dtype plus the scales."""
        b = super().bytes(mode)
        if self.kv_dtype is None:
            return b
        if mode != "fwd":
            raise ValueError(f"a quantized KV cache (kv_dtype={self.kv_dtype}) is read by the forward pass only, "
                             f"got mode {mode!r}")
        kv = 2 * self.counts().kv_rows * self.kv_heads * self.head_dim
        return b - kv * self.itemsize + kv * self.kv_itemsize + self.kv_scale_bytes()

    def kv_cache_bytes_per_token(self) -> int:
        """Bytes of key + value cache one token costs in one layer (per-token scales included)."""
        scales = 2 * 4 * self.kv_heads if self.kv_scale == "token" else 0
        return 2 * self.kv_heads * self.head_dim * self.kv_itemsize + scales

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
                   dtype: str = "bfloat16", kv_scale: str | None = None) -> int:
    """Bytes of key + value cache for a model: 2 * layers * kv_heads * head_dim * itemsize per token, plus
    2 * layers * kv_heads float32 scales per token for a quantized cache with ``kv_scale="token"``."""
    per_token = 2 * layers * kv_heads * (head_dim * _itemsize(dtype) + (4 if kv_scale == "token" else 0))
    return per_token * context * batch
