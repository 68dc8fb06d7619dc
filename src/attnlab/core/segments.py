"""Packed sequences: segment ids, what they let a query see, and their layouts.

Training packs several documents into one row. ``query_segment_ids`` (B, T) and
``key_value_segment_ids`` (B, S) are ints: query t of row b sees key s only when
``query_segment_ids[b, t] == key_value_segment_ids[b, s]`` (and both are >= 0), on top of causal,
windows, lengths and masks. A query row whose id is negative is padding: its output is 0 (as rows
past ``query_seq_lengths``); a key whose id is negative is never seen.

- ``check_segment_ids`` validates them up front (shape, integer dtype, both or neither).
- ``visible(q_ids, kv_ids)``: the (B, 1, T, S) bool mask the dense paths (naive, xla, tokamax) use (the float64
  reference states the rule apart: ``attnlab.reference.float64``).
- ``host_layout(ids)``: on concrete ids, the most segments of a row and whether every row's
  segments are contiguous (an id never returns after another one started).
- ``docs(B, T, n, seed)``: ``n`` documents of random lengths per row, the sweeps' ``docs:n`` packing.
- ``run_lengths(ids)``: each row's documents' lengths (the FLOP count of a packed call, ``core.pairs``).
"""
from __future__ import annotations

import numpy as np

from .checks import _is_tracer


def check_segment_ids(q_ids, kv_ids, batch: int, q_len: int, kv_len: int) -> None:
    """Both or neither; (B, T) and (B, S) integer arrays. ValueError/TypeError naming the argument."""
    if (q_ids is None) != (kv_ids is None):
        given = "query_segment_ids" if q_ids is not None else "key_value_segment_ids"
        raise ValueError(f"{given} needs its partner: give query_segment_ids (B, T) and key_value_segment_ids "
                         "(B, S) together (self-attention over packed rows: the same array twice)")
    if q_ids is None:
        return
    for name, x, want in (("query_segment_ids", q_ids, (batch, q_len)), ("key_value_segment_ids", kv_ids, (batch, kv_len))):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an integer array, got {type(x).__name__}")
        shape = tuple(int(d) for d in x.shape)
        if shape != want:
            letter = "T" if name.startswith("query") else "S"
            raise ValueError(f"{name} must have shape (B, {letter})={want}, got {shape}")
        if np.dtype(x.dtype).kind not in "iu":
            raise TypeError(f"{name} must be an integer array (ids; negative = padding), got dtype {np.dtype(x.dtype).name}")
        if hasattr(x, "__array__") and not _is_tracer(x) and np.size(x):   # concrete values
            vals = np.asarray(x)
            if vals.max() >= 2**31 or vals.min() < -2**31:   # the masks compare ids as int32
                raise ValueError(f"{name} must lie in int32's range [-2**31, 2**31), got {vals.max()}")


def visible(q_ids, kv_ids):
    """Bool (B, 1, T, S): ids equal and both >= 0."""
    import jax.numpy as jnp  # heavy: jax, core imports no JAX

    q = jnp.asarray(q_ids, jnp.int32)[:, :, None]
    kv = jnp.asarray(kv_ids, jnp.int32)[:, None, :]
    return ((q == kv) & (q >= 0) & (kv >= 0))[:, None]


def starts(row: np.ndarray) -> np.ndarray:
    """Positions where a segment (id >= 0) begins in one row of ids."""
    row = np.asarray(row).astype(np.int64)
    prev = np.concatenate([[-(2**62)], row[:-1]])
    return np.nonzero((row >= 0) & (row != prev))[0]


def host_layout(ids) -> tuple[int, bool]:
    """(most segments in a row, every row contiguous) of concrete (B, L) ids."""
    ids = np.asarray(ids)
    most, contiguous = 0, True
    for row in ids:
        st = starts(row)
        most = max(most, len(st))
        contiguous &= len(set(row[st].tolist())) == len(st)
    return most, contiguous


def run_lengths(ids) -> tuple[tuple[int, ...], ...]:
    """Per row of concrete (B, L) contiguous ids: the lengths of its documents (runs of one id >= 0), in
    order; padding (negative ids) is left out. ValueError when an id returns after another one started."""
    out = []
    for row in np.asarray(ids).astype(np.int64):
        st = starts(row)
        if len(set(row[st].tolist())) != len(st):
            raise ValueError("segment ids must be contiguous (an id never returns after another one started) to be "
                             "read as documents; count other layouts with attnlab.core.pairs.count")
        ends = np.append(st[1:], len(row))
        out.append(tuple(int(np.count_nonzero(row[a:b] >= 0)) for a, b in zip(st, ends)))
    return tuple(out)


def docs(batch: int, length: int, n: int, seed: int) -> np.ndarray:
    """(B, L) int32 ids 0..n-1: ``n`` contiguous documents of random lengths (>= 1 token) per row."""
    if not 1 <= n <= length:
        raise ValueError(f"packing docs:{n} needs 1 <= {n} <= the sequence length {length}")
    rng = np.random.default_rng(seed)
    out = np.empty((batch, length), np.int32)
    for b in range(batch):
        cuts = np.sort(rng.choice(np.arange(1, length), size=n - 1, replace=False)) if n > 1 else np.array([], int)
        out[b] = np.searchsorted(cuts, np.arange(length), side="right")
    return out


def parse_packing(text) -> int | None:
    """"none" -> None, "docs:N" -> N (documents per row); ValueError naming a bad value."""
    if text is None or str(text).strip().lower() in ("none", ""):
        return None
    t = str(text).strip().lower()
    if t.startswith("docs:"):
        try:
            n = int(t[5:])
        except ValueError:
            n = 0
        if n >= 1:
            return n
    raise ValueError(f"packing: {text!r} must be none or docs:N with N >= 1 documents per row (e.g. docs:4)")
