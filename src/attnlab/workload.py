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
"""
from __future__ import annotations

import dataclasses

import numpy as np

BWD_FLOP_FACTOR = 2.5


def _itemsize(dtype: str) -> int:
    import ml_dtypes  # noqa: F401  (registers bfloat16 and float8 names with NumPy)

    return np.dtype(dtype).itemsize


@dataclasses.dataclass(frozen=True)
class Workload:
    """One attention problem. Lengths are per-batch-element valid lengths (None = full)."""

    batch: int
    q_len: int
    kv_len: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    causal: bool = False
    window: tuple[int, int] | None = None
    q_lengths: tuple[int, ...] | None = None
    kv_lengths: tuple[int, ...] | None = None
    decode: bool = False

    def __post_init__(self):
        for f in ("batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim"):
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{f} must be a positive int, got {v!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads}")
        if self.window is not None and (len(self.window) != 2 or min(self.window) < 0):
            raise ValueError(f"window must be (left, right) with both >= 0, got {self.window!r}")
        for name, lens, limit in (("q_lengths", self.q_lengths, self.q_len), ("kv_lengths", self.kv_lengths, self.kv_len)):
            if lens is not None and (len(lens) != self.batch or min(lens) < 0 or max(lens) > limit):
                raise ValueError(f"{name} must hold {self.batch} values in [0, {limit}], got {lens!r}")
        if self.decode and self.kv_lengths is not None and min(self.kv_lengths) < self.q_len:
            raise ValueError(f"decode: every kv_lengths value must be >= q_len={self.q_len} (the new tokens are in "
                             f"the cache), got {self.kv_lengths!r}")
        _itemsize(self.dtype)

    # --- counts -----------------------------------------------------------
    def kept_pairs(self) -> int:
        """Number of (b, t, s) triples a query actually attends to (per head)."""
        t = np.arange(self.q_len, dtype=np.int64)
        total = 0
        q_lens = self.q_lengths or (self.q_len,) * self.batch
        kv_lens = self.kv_lengths or (self.kv_len,) * self.batch
        cache: dict[tuple[int, int], int] = {}
        for ql, kl in zip(q_lens, kv_lens):
            if (ql, kl) not in cache:
                pos = t + (kl - self.q_len if self.decode else 0)
                lo = np.zeros_like(t)
                hi = np.full_like(t, kl - 1)
                if self.causal:
                    hi = np.minimum(hi, pos)
                if self.window is not None:
                    lo = np.maximum(lo, pos - self.window[0])
                    hi = np.minimum(hi, pos + self.window[1])
                per_row = np.clip(hi - lo + 1, 0, None)[:ql]
                cache[(ql, kl)] = int(per_row.sum())
            total += cache[(ql, kl)]
        return total

    @property
    def itemsize(self) -> int:
        return _itemsize(self.dtype)

    def flops(self, mode: str = "fwd") -> float:
        """FLOPs for ``mode`` in {"fwd", "bwd", "fwd+bwd"}."""
        fwd = 4.0 * self.heads * self.head_dim * self.kept_pairs()
        return {"fwd": fwd, "bwd": BWD_FLOP_FACTOR * fwd, "fwd+bwd": (1 + BWD_FLOP_FACTOR) * fwd}[_mode(mode)]

    def bytes(self, mode: str = "fwd") -> float:
        """Fewest bytes moved through device memory for ``mode``."""
        q = self.batch * self.q_len * self.heads * self.head_dim
        kv = self.kv_tokens() * self.kv_heads * self.head_dim
        fwd = (q + 2 * kv + q) * self.itemsize
        bwd = (3 * q + 2 * kv + q + 2 * kv) * self.itemsize  # read q,k,v,o,do; write dq,dk,dv
        return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[_mode(mode)]

    def kv_tokens(self) -> int:
        """Key/value positions read over the batch: all S per element, or (decode) the valid ones."""
        if self.decode and self.kv_lengths is not None:
            return int(sum(self.kv_lengths))
        return self.batch * self.kv_len

    def kv_bytes(self) -> int:
        """Bytes of the key and value caches a forward pass reads (decode: valid lengths only)."""
        return 2 * self.kv_tokens() * self.kv_heads * self.head_dim * self.itemsize

    def intensity(self, mode: str = "fwd") -> float:
        """Arithmetic intensity in FLOP per byte."""
        return self.flops(mode) / self.bytes(mode)

    def kv_cache_bytes_per_token(self) -> int:
        """Bytes of key + value cache one token costs in one layer."""
        return 2 * self.kv_heads * self.head_dim * self.itemsize

    @property
    def label(self) -> str:
        w = f" w{self.window[0]},{self.window[1]}" if self.window else ""
        c = " causal" if self.causal else ""
        return f"B{self.batch} T{self.q_len} S{self.kv_len} N{self.heads}/{self.kv_heads} H{self.head_dim} {self.dtype}{c}{w}"

    @classmethod
    def from_spec(cls, spec) -> "Workload":
        return cls(spec.batch, spec.q_len, spec.kv_len, spec.heads, spec.kv_heads, spec.head_dim,
                   spec.dtype, spec.is_causal, spec.window)


def _mode(mode: str) -> str:
    if mode not in ("fwd", "bwd", "fwd+bwd"):
        raise ValueError(f"mode must be 'fwd', 'bwd' or 'fwd+bwd', got {mode!r}")
    return mode


def kv_cache_bytes(*, layers: int, kv_heads: int, head_dim: int, context: int, batch: int = 1,
                   dtype: str = "bfloat16") -> int:
    """Bytes of key + value cache for a model: 2 * layers * kv_heads * head_dim * itemsize per token."""
    return 2 * layers * kv_heads * head_dim * _itemsize(dtype) * context * batch
