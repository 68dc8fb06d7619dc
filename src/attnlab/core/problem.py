"""One attention problem: the sizes every layer of attnlab describes a call by, per-request lengths included.

``Problem(batch B, q_len T, kv_len S, heads N, kv_heads K, head_dim H, dtype, causal, window,
q_lengths, kv_lengths, decode, doc_lengths, kv_dtype, kv_scale, page_size)`` (shape letters as in
``attnlab.core.prepare``). The first nine are the record's identity (``FIELDS``); the rest say which (query, key)
pairs are valid work, and at what bytes (a quantized KV cache, ``attnlab.core.kv_quant``):

- ``q_lengths`` / ``kv_lengths``: per-request valid lengths (None: every request fills q_len / kv_len);
- ``decode``: cache semantics, as ``decode_attention`` and ``serving_attention`` run: request b's
  new queries are the last tokens of its ``kv_lengths[b]`` (query t at position kv_lengths[b] - q_len[b] + t).
  With ``q_lengths`` too it is a serving step: the queries are packed token by token, ``q_len`` is the token
  budget T_total and sum(q_lengths) <= q_len (``serving``); a prefill chunk is a request with q_lengths[b] > 1;
- ``doc_lengths``: packed rows (T == S), each row's contiguous documents.

It is the one place that
- validates a problem (positive sizes, N a multiple of K, a dtype NumPy knows or a short name such as
  ``bf16`` (read as ``bfloat16``, ``attnlab.core.names``), window ``(left, right)`` of non-negative ints,
  lengths within the sizes), raising ``ProblemError`` (a ``ValueError``) naming the field;
  ``attnlab.core.checks.call_problem`` says the same rule in a call's argument names;
- counts its cost exactly (``attnlab.core.pairs``; FLOPs and bytes in the FlashAttention convention, the rule in
  ``attnlab.core.workload``; a serving step's equal ``attnlab.core.serving_cost``'s; a quantized cache's scales);
- names it: ``label`` (``B2 T128 S128 N8/2 H64 bfloat16 causal w64:0``, the format of the sweep's configuration
  labels), ``key``/``identity`` (the nine JSON fields a record holds), ``lengths_record`` (the per-request lengths).

A call (``attnlab.core.call.Call``: attention, decode or serving) and ``measure.Cell`` hold one.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Mapping

import numpy as np

from . import kv_quant, pairs
from .names import canonical_dtype

BWD_FLOP_FACTOR = 2.5
#: The size fields, in record order; each must be a positive int.
SIZES = ("batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim")


def itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype`` (bfloat16 and float8 names included); ValueError naming dtype."""
    import ml_dtypes  # heavy: ml_dtypes, on first use  # noqa: F401  (registers bfloat16 and float8 names with NumPy)

    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        raise ValueError(f"dtype must be a dtype name NumPy knows (e.g. bfloat16, float32), got {dtype!r}") from None


class ProblemError(ValueError):
    """A broken ``Problem`` rule; ``fields`` names the fields it is about (``("heads", "kv_heads")``
    when N is not a multiple of K), so a caller can say it in its own argument names."""

    def __init__(self, message: str, *fields: str):
        super().__init__(message)
        self.fields = fields


@dataclasses.dataclass(frozen=True)
class Problem:
    """One attention problem (see the module docstring)."""

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
    #: packed rows (T == S): each row's contiguous documents' lengths in order, shared by queries and
    #: keys (``segments.docs``); tokens past a row's sum are padding (segment id -1)
    doc_lengths: tuple[tuple[int, ...], ...] | None = None
    #: a quantized KV cache (``core.kv_quant``): its dtype and scale layout; K and V are read at the cache's
    #: dtype plus the scales; ``page_size``: a paged cache's page size (the pages a ``page`` layout reads a scale of)
    kv_dtype: str | None = None
    kv_scale: str | None = None
    page_size: int | None = None

    def __post_init__(self):
        for f in SIZES:
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ProblemError(f"{f} must be a positive int, got {v!r}", f)
        if self.heads % self.kv_heads:
            raise ProblemError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads}", "heads", "kv_heads")
        w = self.window
        if w is not None:
            if (not isinstance(w, (tuple, list)) or len(w) != 2
                    or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0 for x in w)):
                raise ProblemError(f"window must be (left, right) with both >= 0, got {w!r}", "window")
            if isinstance(w, list):
                object.__setattr__(self, "window", tuple(w))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))   # bf16 -> bfloat16
        try:
            itemsize(self.dtype)
        except ValueError as e:
            raise ProblemError(str(e), "dtype") from None
        self._check_lengths()
        object.__setattr__(self, "kv_dtype", kv_quant.checked_cache(self.kv_dtype, self.kv_scale, self.page_size))

    def _check_lengths(self):
        """Per-request lengths: B values each, q in [0, q_len] (a packed serving step's 0: an idle slot), kv in [0,
        kv_len]; decode: kv >= q (the new tokens are in the cache) and packed queries within the token budget q_len."""
        for name, limit in (("q_lengths", self.q_len), ("kv_lengths", self.kv_len)):
            lens = getattr(self, name)
            if lens is None:
                continue
            try:
                lens = tuple(int(x) for x in lens if int(x) == x)
            except (TypeError, ValueError):
                lens = ()
            if len(lens) != self.batch or min(lens) < 0 or max(lens) > limit:
                raise ProblemError(f"{name} must hold {self.batch} ints in [0, {limit}], got {getattr(self, name)!r}",
                                   name)
            object.__setattr__(self, name, lens)
        if self.decode:
            q = self.q_lengths or (self.q_len,) * self.batch
            if self.kv_lengths is not None and any(k < n for k, n in zip(self.kv_lengths, q)):
                raise ProblemError(f"decode: every kv_lengths value must be >= its request's new tokens "
                                   f"{'q_lengths' if self.q_lengths else f'q_len={self.q_len}'} (they are in the "
                                   f"cache), got {self.kv_lengths!r}", "kv_lengths")
            if self.q_lengths is not None and sum(self.q_lengths) > self.q_len:
                raise ProblemError(f"q_lengths (packed, decode) must sum to at most the token budget q_len="
                                   f"{self.q_len}, got {sum(self.q_lengths)}", "q_lengths")
        d = self.doc_lengths
        if d is not None:
            if self.q_len != self.kv_len or self.decode or self.q_lengths is not None or self.kv_lengths is not None:
                raise ProblemError("doc_lengths (packed rows) needs q_len == kv_len, no decode and no q/kv lengths",
                                   "doc_lengths")
            if len(d) != self.batch or any(min(row, default=1) < 1 or sum(row) > self.q_len for row in d):
                raise ProblemError(f"doc_lengths must hold {self.batch} rows of positive document lengths summing to "
                                   f"at most q_len={self.q_len}, got {d!r}", "doc_lengths")
            object.__setattr__(self, "doc_lengths", tuple(tuple(int(x) for x in row) for row in d))

    @classmethod
    def of(cls, obj) -> "Problem":
        """The Problem of anything holding its fields: a record dict or an object with the attributes."""
        get = obj.get if isinstance(obj, Mapping) else lambda k, d=None: getattr(obj, k, d)
        w = get("window")
        return cls(*(get(f) for f in SIZES), get("dtype", "bfloat16"), bool(get("causal", False)),
                   tuple(w) if w else None)

    def as_problem(self) -> "Problem":
        """The nine identity fields alone (the per-request lengths, decode and documents dropped)."""
        return Problem(*(getattr(self, f) for f in FIELDS))

    @classmethod
    def serving(cls, q_lengths, kv_lengths, heads: int, kv_heads: int, head_dim: int, dtype: str = "bfloat16", *,
                total_tokens: int | None = None, kv_len_max: int | None = None, window=None) -> "Problem":
        """A serving step (``attnlab.serving_attention``): request b's q_lengths[b] new tokens attend causally
        to its kv_lengths[b] cached tokens (the new ones included); the token budget T_total (default the sum)
        and the cache capacity S_max (default the longest) are the problem's q_len and kv_len. A ragged
        decode batch is the case of equal q_lengths."""
        q, kv = tuple(int(x) for x in q_lengths), tuple(int(x) for x in kv_lengths)
        return cls(len(kv), total_tokens or sum(q), kv_len_max or max(kv, default=1), heads, kv_heads, head_dim,
                   dtype, True, window, q, kv, True)

    # --- names --------------------------------------------------------------
    def identity(self) -> dict:
        """The record's identity fields of the problem (``FIELDS``, window as a JSON list)."""
        d = {f: getattr(self, f) for f in FIELDS}
        d["window"] = list(self.window) if self.window else None
        return d

    def lengths_record(self, seed: int | None = None, short: int = 64) -> dict | None:
        """The per-request lengths as a record stores them (None without lengths): totals, extremes and the
        median of the KV lengths, the seed they were drawn with, and the lists themselves when the batch
        has at most ``short`` requests (the distribution's name is the record's ``lengths``)."""
        if self.q_lengths is None and self.kv_lengths is None:
            return None
        q = self.q_lengths or (self.q_len,) * self.batch
        kv = self.kv_lengths or (self.kv_len,) * self.batch
        out = {"requests": self.batch, "seed": seed, "q_total": sum(q), "q_max": max(q), "kv_total": sum(kv),
               "kv_min": min(kv), "kv_median": int(np.median(kv)), "kv_max": max(kv)}
        if self.batch <= short:
            out.update(q=list(q), kv=list(kv))
        return out

    def key(self) -> str:
        return json.dumps(self.identity(), sort_keys=True)

    @property
    def label(self) -> str:
        return label(self.identity())

    # --- counts -------------------------------------------------------------
    @property
    def groups(self) -> int:
        return self.heads // self.kv_heads

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    @property
    def kv_itemsize(self) -> int:
        """Bytes per element of the K/V cache: a quantized cache's dtype, else the problem's."""
        return itemsize(self.kv_dtype) if self.kv_dtype else self.itemsize

    def counts(self) -> "pairs.Counts":
        """What the call computes, exactly (``attnlab.core.pairs``): pairs, query rows and keys in use,
        lengths, decode alignment and documents included."""
        if self.doc_lengths is not None:
            return pairs.doc_counts([n for row in self.doc_lengths for n in row],
                                    *pairs.band(self.causal, self.window, 2 * self.q_len + 1))
        return pairs.count(self.q_len, self.kv_len, causal=self.causal, window=self.window,
                           q_lengths=self.q_lengths or (self.q_len,) * self.batch,
                           kv_lengths=self.kv_lengths or (self.kv_len,) * self.batch, decode=self.decode)

    def new_tokens(self) -> int:
        """Query tokens of the call: sum(q_lengths), else B * T (a serving step's tokens per second count these)."""
        return sum(self.q_lengths) if self.q_lengths is not None else self.batch * self.q_len

    def kept_pairs(self) -> int:
        """Number of (b, t, s) triples a query actually attends to (per head)."""
        return self.counts().pairs

    def kv_tokens(self) -> int:
        """Key/value positions read over the batch: those some query sees (``Counts.kv_rows``)."""
        return self.counts().kv_rows

    def flops(self, mode: str = "fwd") -> float:
        """FLOPs for ``mode`` in {"fwd", "bwd", "fwd+bwd"}."""
        mode = _mode(mode)
        fwd = 4.0 * self.heads * self.head_dim * self.kept_pairs()
        return {"fwd": fwd, "bwd": BWD_FLOP_FACTOR * fwd, "fwd+bwd": (1 + BWD_FLOP_FACTOR) * fwd}[mode]

    def bytes(self, mode: str = "fwd") -> float:
        """Fewest bytes moved through device memory for ``mode`` (``attnlab.core.workload``'s rule): the
        query rows and keys the call uses are read, the outputs are written whole."""
        mode = _mode(mode)
        c = self.counts()
        # outputs written whole; a cache call (decode) writes the rows of its new tokens only (packed serving)
        q_all = (self.new_tokens() if self.decode else self.batch * self.q_len) * self.heads * self.head_dim
        q = c.q_rows * self.heads * self.head_dim
        kv = c.kv_rows * self.kv_heads * self.head_dim
        kv_all = self.batch * self.kv_len * self.kv_heads * self.head_dim
        if self.kv_dtype is not None and mode != "fwd":
            raise ValueError(f"a quantized KV cache (kv_dtype={self.kv_dtype}) is read by the forward pass only, "
                             f"got mode {mode!r}")
        fwd = (q + q_all) * self.itemsize + 2 * kv * self.kv_itemsize + self.scale_bytes()
        bwd = (3 * q + 2 * kv + q_all + 2 * kv_all) * self.itemsize  # read q,k,v,o,do; write dq,dk,dv
        return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]

    def intensity(self, mode: str = "fwd") -> float:
        """Arithmetic intensity in FLOP per byte."""
        return self.flops(mode) / self.bytes(mode)

    def kv_bytes(self) -> int:
        """Bytes of the K and V caches a forward pass reads (decode: valid lengths only), scales included."""
        return 2 * self.kv_tokens() * self.kv_heads * self.head_dim * self.kv_itemsize + self.scale_bytes()

    def scale_bytes(self) -> int:
        """Bytes of the float32 k_scale and v_scale the forward pass reads (0 for a float cache): per KV head, one
        per token of the keys it reads (``token``), per page of them (``page``: of the keys a row's queries read, from
        a decode window's first key; top-left aligned, up to its last query's reach or its documents' end) or one
        (``head``); one in all (``tensor``)."""
        if self.kv_dtype is None or self.kv_scale in ("head", "tensor"):
            return 0 if self.kv_dtype is None else 2 * 4 * (self.kv_heads if self.kv_scale == "head" else 1)
        kv, q = (np.asarray(x or (n,) * self.batch) for x, n in ((self.kv_lengths, self.kv_len), (self.q_lengths, self.q_len)))
        end = kv
        if not self.decode:     # query t reads keys up to t + hi (keys from 0: lo <= 0); a packed row its documents'
            hi = pairs.band(self.causal, self.window, self.q_len + self.kv_len + 1)[1]
            end = (np.array([sum(r) for r in self.doc_lengths]) if self.doc_lengths is not None
                   else np.minimum(kv, q + hi))
        first = np.maximum(kv - q - self.window[0], 0) if self.window is not None and self.decode else np.zeros_like(kv)
        first = np.where(q > 0, first, end)       # a row of no query (an idle serving slot) reads no page
        per_head = self.kv_tokens() if self.kv_scale == "token" else kv_quant.pages_read(first, end, self.page_size)
        return 2 * 4 * per_head * self.kv_heads


#: The identity fields, in record order (the identity of a record starts with them after backend).
FIELDS = ("batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "dtype", "causal", "window")


def label(fields: Mapping) -> str:
    """``B T S N/K H dtype [causal] [wL:R]`` of a problem's fields (a record or ``Problem.identity()``)."""
    w = fields.get("window")
    parts = [f"B{fields['batch']}", f"T{fields['q_len']}", f"S{fields['kv_len']}",
             f"N{fields['heads']}/{fields['kv_heads']}", f"H{fields['head_dim']}", fields["dtype"]]
    if fields.get("causal"):
        parts.append("causal")
    if w:
        parts.append(f"w{w[0]}:{w[1]}")
    return " ".join(parts)


def _mode(mode: str) -> str:
    if mode not in ("fwd", "bwd", "fwd+bwd"):
        raise ValueError(f"mode must be 'fwd', 'bwd' or 'fwd+bwd', got {mode!r}")
    return mode

