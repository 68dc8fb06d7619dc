"""Exactly what an attention call computes: its (query, key) pairs, the query rows that see a key and
the keys some query sees, for causal, windowed, ragged, padded, decode and packed calls.

Query t of row b sits at position ``t + offset[b]`` (offset 0; decode: ``kv_lengths[b] - q_lengths[b]``, the
new tokens are the last ones of the sequence). It is computed with key s when all of these hold:

- ``t < q_lengths[b]`` and ``s < kv_lengths[b]`` (padding is never computed);
- ``lo <= s - position <= hi`` (``band``: causal gives ``hi = 0``, a window ``(left, right)`` gives
  ``lo = -left`` and ``hi = right``; jax.nn's top-left causal alignment when T != S);
- packed rows: the segment ids are equal and both >= 0 (``attnlab.core.segments``).

``Counts.pairs`` is per head and summed over the batch (FLOPs = 4 N H pairs, ``attnlab.core.workload``).
``band_counts`` is the closed form (O(T) NumPy per distinct row) without segment ids; ``doc_counts`` the
closed form of contiguous documents shared by queries and keys (``--packing docs:N``); ``count`` takes
any segment ids (vectorized ``searchsorted`` over the batch, O((T + S) log S)).
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np


@dataclasses.dataclass(frozen=True)
class Counts:
    """Per head, summed over the batch: computed (t, s) pairs, query rows that see >= 1 key, keys seen by >= 1 query."""

    pairs: int
    q_rows: int
    kv_rows: int

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(self.pairs + other.pairs, self.q_rows + other.q_rows, self.kv_rows + other.kv_rows)


ZERO = Counts(0, 0, 0)


def band(causal: bool, window, reach: int) -> tuple[int, int]:
    """(lo, hi) bounds of ``s - position``; ``reach`` (>= T + S) stands for "unbounded"."""
    lo, hi = -reach, reach
    if window is not None:
        lo, hi = max(lo, -int(window[0])), min(hi, int(window[1]))
    if causal:
        hi = min(hi, 0)
    return lo, hi


@functools.lru_cache(maxsize=4096)
def band_counts(q_rows: int, kv_len: int, offset: int, lo: int, hi: int) -> Counts:
    """One row: queries t < ``q_rows`` at ``t + offset`` against keys s < ``kv_len`` within [lo, hi]."""
    pos = np.arange(q_rows, dtype=np.int64) + offset
    first = np.maximum(0, pos + lo)
    last = np.minimum(kv_len - 1, pos + hi)
    per_row = np.clip(last - first + 1, 0, None)
    seen = per_row > 0
    if not seen.any():
        return ZERO
    # first and last grow with t: the union of the rows' key ranges, each row adding keys past all before it
    f, la = first[seen], last[seen]
    before = np.concatenate([[-1], np.maximum.accumulate(la)[:-1]])
    keys = int(np.clip(la - np.maximum(f, before + 1) + 1, 0, None).sum())
    return Counts(int(per_row.sum()), int(seen.sum()), keys)


def _sum_within(n, a, b):
    """Sum over d in [a, b] of (n - |d|), elementwise for int64 arrays (0 where a > b)."""
    def part(x, y, sign):       # sum over d in [x, y] of (n + sign * d), 0 when empty
        k = np.clip(y - x + 1, 0, None)
        return k * n + sign * (x + y) * k // 2
    return part(a, np.minimum(b, -1), 1) + part(np.maximum(a, 0), b, -1)


def doc_counts(doc_lengths, lo: int, hi: int) -> Counts:
    """Contiguous documents of ``doc_lengths`` tokens (queries and keys share them, T == S): each one is
    an L x L self-attention within [lo, hi], in closed form: sum over d = s - t in the band of (L - |d|)."""
    n = np.asarray(doc_lengths, dtype=np.int64).ravel()
    n = n[n > 0]
    if n.size == 0 or lo > hi:
        return ZERO
    a, b = np.maximum(lo, -(n - 1)), np.minimum(hi, n - 1)
    pairs = int(np.where(a <= b, _sum_within(n, a, b), 0).sum())
    # query t sees a key iff t + hi >= 0 and t + lo <= L - 1; key s is seen iff s - hi <= L - 1 and s - lo >= 0
    q = np.clip(np.minimum(n - 1, n - 1 - lo) - np.maximum(0, -hi) + 1, 0, None)
    k = np.clip(np.minimum(n - 1, n - 1 + hi) - np.maximum(0, lo) + 1, 0, None)
    return Counts(pairs, int(q.sum()), int(k.sum()))


def count(q_len: int, kv_len: int, *, causal: bool = False, window=None, q_lengths=None, kv_lengths=None,
          decode: bool = False, q_segment_ids=None, kv_segment_ids=None) -> Counts:
    """The exact counts of one call (see the module docstring); lengths are per-batch-element sequences,
    segment ids (B, T) and (B, S) integer arrays (both or neither)."""
    batch = len(q_lengths if q_lengths is not None else kv_lengths if kv_lengths is not None
                else q_segment_ids if q_segment_ids is not None else [0])
    qls = [q_len] * batch if q_lengths is None else [int(x) for x in q_lengths]
    kls = [kv_len] * batch if kv_lengths is None else [int(x) for x in kv_lengths]
    offs = [kl - ql if decode else 0 for ql, kl in zip(qls, kls)]
    lo, hi = band(causal, window, q_len + kv_len + 1)
    if q_segment_ids is None:
        total = ZERO
        for ql, kl, off in zip(qls, kls, offs):
            total = total + band_counts(ql, kl, off, lo, hi)
        return total
    return _segment_counts(np.asarray(q_segment_ids), np.asarray(kv_segment_ids), qls, kls, offs, lo, hi)


def _segment_counts(q_ids, kv_ids, qls, kls, offs, lo, hi) -> Counts:
    """Any segment ids: each (row, id) group gets its own stretch of one number line (``stride`` apart,
    farther than any band reaches), so one sorted ``searchsorted`` counts every row and document at once."""
    B, T = q_ids.shape
    S = kv_ids.shape[1]
    t, s = np.arange(T), np.arange(S)
    q_ok = (t[None] < np.asarray(qls)[:, None]) & (q_ids >= 0)
    k_ok = (s[None] < np.asarray(kls)[:, None]) & (kv_ids >= 0)
    qb, qt = np.nonzero(q_ok)
    kb, ks = np.nonzero(k_ok)
    if qb.size == 0 or kb.size == 0 or lo > hi:
        return ZERO
    groups = np.concatenate([qb.astype(np.int64) << 32 | (q_ids[qb, qt].astype(np.int64) & 0xFFFFFFFF),
                             kb.astype(np.int64) << 32 | (kv_ids[kb, ks].astype(np.int64) & 0xFFFFFFFF)])
    g = np.unique(groups, return_inverse=True)[1].ravel()
    stride = 4 * (T + S + 1)
    qc = np.sort(g[:qb.size] * stride + qt + np.asarray(offs, dtype=np.int64)[qb])
    kc = np.sort(g[qb.size:] * stride + ks)
    per_q = np.searchsorted(kc, qc + hi, "right") - np.searchsorted(kc, qc + lo, "left")
    per_k = np.searchsorted(qc, kc - lo, "right") - np.searchsorted(qc, kc - hi, "left")
    return Counts(int(per_q.sum()), int((per_q > 0).sum()), int((per_k > 0).sum()))
