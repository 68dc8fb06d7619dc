"""What one attention call costs: FLOPs and bytes in the FlashAttention convention.

Forward FLOPs = 4 * N * H * (kept (t, s) pairs summed over the batch): two matmuls
(QK^T and PV) of 2 FLOPs per multiply-add. Causal masks, windows and padding count
only kept entries (about half for causal with T = S). Query heads are counted (GQA
does the same arithmetic as MHA). Backward = 2.5 x forward.
Bytes (forward) = q, k, v read once + the output written once.
Bytes (backward) = q, k, v, out, d_out read once + dq, dk, dv written once.
Decode (``decode=True``): the T queries are the last T tokens of each sequence of kv_lengths[b]
tokens (query t at position kv_lengths[b] - T + t; causal means keys at or before it), and only the
valid keys and values are counted as read: the bytes a kernel that reads no padding must move.

``Workload`` is an ``attnlab.core.problem.Problem`` (its fields, validation, label and counts) with the
per-batch-element valid lengths and the decode flag on top.
"""
from __future__ import annotations

import dataclasses

from .problem import BWD_FLOP_FACTOR, Problem, _mode, itemsize as _itemsize  # noqa: F401  (re-exported)


@dataclasses.dataclass(frozen=True)
class Workload(Problem):
    """One attention problem. Lengths are per-batch-element valid lengths (None = full)."""

    q_lengths: tuple[int, ...] | None = None
    kv_lengths: tuple[int, ...] | None = None
    decode: bool = False

    def __post_init__(self):
        super().__post_init__()
        for name, lens, limit in (("q_lengths", self.q_lengths, self.q_len), ("kv_lengths", self.kv_lengths, self.kv_len)):
            if lens is not None and (len(lens) != self.batch or min(lens) < 0 or max(lens) > limit):
                raise ValueError(f"{name} must hold {self.batch} values in [0, {limit}], got {lens!r}")
        if self.decode and self.kv_lengths is not None and min(self.kv_lengths) < self.q_len:
            raise ValueError(f"decode: every kv_lengths value must be >= q_len={self.q_len} (the new tokens are in "
                             f"the cache), got {self.kv_lengths!r}")

    # --- counts -----------------------------------------------------------
    def kept_pairs(self) -> int:
        """Number of (b, t, s) triples a query actually attends to (per head)."""
        return self._kept(self.q_lengths or (self.q_len,) * self.batch,
                          self.kv_lengths or (self.kv_len,) * self.batch, self.decode)

    def kv_tokens(self) -> int:
        """Key/value positions read over the batch: all S per element, or (decode) the valid ones."""
        if self.decode and self.kv_lengths is not None:
            return int(sum(self.kv_lengths))
        return self.batch * self.kv_len

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


def kv_cache_bytes(*, layers: int, kv_heads: int, head_dim: int, context: int, batch: int = 1,
                   dtype: str = "bfloat16") -> int:
    """Bytes of key + value cache for a model: 2 * layers * kv_heads * head_dim * itemsize per token."""
    return 2 * layers * kv_heads * head_dim * _itemsize(dtype) * context * batch
