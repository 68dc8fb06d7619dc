"""One attention problem: the nine numbers every layer of attnlab describes a call by.

``Problem(batch B, q_len T, kv_len S, heads N, kv_heads K, head_dim H, dtype, causal, window)``
(shape letters as in ``attnlab.core.spec``). It is the one place that

- validates a problem (positive sizes, N a multiple of K, a dtype NumPy knows or a short name such as
  ``bf16`` (read as ``bfloat16``, ``attnlab.core.names``), window
  ``(left, right)`` of non-negative ints), raising ``ProblemError`` (a ``ValueError``) naming the
  field; ``attnlab.core.checks.call_problem`` says the same rule in a call's argument names;
- counts its cost (FLOPs and bytes in the FlashAttention convention, ``attnlab.core.workload``);
- names it: ``label`` (``B2 T128 S128 N8/2 H64 bfloat16 causal w64:0``, the format of the
  sweep's configuration labels) and ``key``/``identity`` (the JSON fields a record stores).

``AttentionSpec`` (the prepared call), ``DecodeSpec`` (a prepared decode call, ``attnlab.api.decode``),
``Workload`` (the cost model, with decode lengths) and ``measure.Cell`` (one sweep cell) hold or extend
a Problem instead of repeating its fields.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Mapping

import numpy as np

from . import pairs
from .names import canonical_dtype

BWD_FLOP_FACTOR = 2.5
#: The size fields, in record order; each must be a positive int.
SIZES = ("batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim")


def itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype`` (bfloat16 and float8 names included); ValueError naming dtype."""
    import ml_dtypes  # noqa: F401  (registers bfloat16 and float8 names with NumPy)

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

    @classmethod
    def of(cls, obj) -> "Problem":
        """The Problem of anything holding its fields: a record dict or an object with the attributes."""
        get = obj.get if isinstance(obj, Mapping) else lambda k, d=None: getattr(obj, k, d)
        w = get("window")
        return cls(*(get(f) for f in SIZES), get("dtype", "bfloat16"), bool(get("causal", False)),
                   tuple(w) if w else None)

    def as_problem(self) -> "Problem":
        """This problem alone (a subclass such as ``Workload`` drops its extra fields)."""
        return Problem(*(getattr(self, f.name) for f in dataclasses.fields(Problem)))

    # --- names --------------------------------------------------------------
    def identity(self) -> dict:
        """The record fields of the problem, in field order (window as a JSON list)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(Problem)}
        d["window"] = list(self.window) if self.window else None
        return d

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

    def counts(self) -> "pairs.Counts":
        """What the call computes, exactly (``attnlab.core.pairs``): pairs, query rows and keys in use."""
        return pairs.count(self.q_len, self.kv_len, causal=self.causal, window=self.window,
                           kv_lengths=(self.kv_len,) * self.batch)

    def kept_pairs(self) -> int:
        """Number of (b, t, s) triples a query actually attends to (per head)."""
        return self.counts().pairs

    def kv_tokens(self) -> int:
        """Key/value positions read over the batch: those some query sees (``Counts.kv_rows``)."""
        return self.counts().kv_rows

    def flops(self, mode: str = "fwd") -> float:
        """FLOPs for ``mode`` in {"fwd", "bwd", "fwd+bwd"}."""
        fwd = 4.0 * self.heads * self.head_dim * self.kept_pairs()
        return {"fwd": fwd, "bwd": BWD_FLOP_FACTOR * fwd, "fwd+bwd": (1 + BWD_FLOP_FACTOR) * fwd}[_mode(mode)]

    def bytes(self, mode: str = "fwd") -> float:
        """Fewest bytes moved through device memory for ``mode`` (``attnlab.core.workload``'s rule): the
        query rows and keys the call uses are read, the outputs are written whole."""
        c = self.counts()
        q_all = self.batch * self.q_len * self.heads * self.head_dim
        q = c.q_rows * self.heads * self.head_dim
        kv = c.kv_rows * self.kv_heads * self.head_dim
        kv_all = self.batch * self.kv_len * self.kv_heads * self.head_dim
        fwd = (q + 2 * kv + q_all) * self.itemsize
        bwd = (3 * q + 2 * kv + q_all + 2 * kv_all) * self.itemsize  # read q,k,v,o,do; write dq,dk,dv
        return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[_mode(mode)]

    def intensity(self, mode: str = "fwd") -> float:
        """Arithmetic intensity in FLOP per byte."""
        return self.flops(mode) / self.bytes(mode)


#: Problem's field names, in record order (the identity of a record starts with them after backend).
FIELDS = tuple(f.name for f in dataclasses.fields(Problem))


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


def delegate_fields(cls, **aliases):
    """Give ``cls`` (which holds a ``problem``) read-only properties for the problem's fields, so
    ``obj.heads`` reads ``obj.problem.heads``; ``aliases`` renames some (``is_causal="causal"``)."""
    names = {f: f for f in FIELDS if f not in aliases.values()}
    names.update(aliases)
    for attr, field in names.items():
        setattr(cls, attr, property(lambda self, field=field: getattr(self.problem, field),
                                    doc=f"``problem.{field}``"))
    return cls
