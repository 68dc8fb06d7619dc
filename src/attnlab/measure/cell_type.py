"""A sweep cell: one (backend, problem, mode) and its identity fields (``attnlab.core.cell_fields``).

``Cell`` is a frozen dataclass made from the declaration: its fields are ``backend``, ``problem``, ``mode`` and
each of ``cell_fields.CELL_FIELDS`` in order; its identity (``Cell.identity``, ``IDENTITY``) and a record's key
(``record_key``) are those fields with the problem spelled out. Measuring it: ``attnlab.measure.cell``.
"""
from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np

from ..core import segments, strategies
from ..core.cell_fields import CELL_FIELDS, DEFAULTS, NAMES
from ..core.call import ProblemFields
from ..core.checks import check_soft_cap
from ..core.problem import FIELDS as PROBLEM_FIELDS, Problem
from ..core.records import config_label
from ..reference.inputs import DISTRIBUTIONS
from ..reference.inputs import seed_of
from . import kv_cells, serving_cell

MODES = ("fwd", "fwd+bwd", "bwd")
#: Decode cells (``lengths`` set): the q_len queries are the last tokens of each sequence of the cache.
LENGTHS = ("full", "ragged", "paged")     # paged: full lengths in a paged cache of ``page_size`` (vLLM layout)
#: The order ``Cell(...)`` has always taken positional arguments in; identity fields added later are keyword-only.
POSITIONAL = PROBLEM_FIELDS + ("mode", "devices", "strategy", "lengths", "inputs", "page_size", "soft_cap", "packing",
                               "kv_dtype", "kv_scale", "prefill_chunks")


class _CellMethods(ProblemFields):
    """``Cell(backend, B, T, S, N, K, H, dtype, causal, window, mode, devices, strategy, lengths, inputs, ...)``
    (positional or keyword, or ``Cell(backend, problem=Problem(...), mode=...)``); the problem's fields read as
    attributes (``cell.batch``, ``cell.window``). Unknown arguments raise ``TypeError``."""

    def __init__(self, backend, *args, problem: Problem | None = None, **kw):
        if len(args) > len(POSITIONAL):
            raise TypeError(f"Cell takes at most {len(POSITIONAL) + 1} positional arguments, got {len(args) + 1}")
        if twice := set(POSITIONAL[:len(args)]) & set(kw):
            raise TypeError(f"Cell got {', '.join(sorted(twice))} both positionally and by keyword")
        kw.update(zip(POSITIONAL, args))
        if unknown := set(kw) - set(PROBLEM_FIELDS) - {"mode", *NAMES}:
            raise TypeError(f"Cell got unknown argument(s) {', '.join(sorted(unknown))}")
        given = {f: kw.pop(f) for f in PROBLEM_FIELDS if f in kw}
        if problem is None:
            problem = Problem(**{f: given.get(f) for f in PROBLEM_FIELDS[:6]},
                              **{f: given[f] for f in PROBLEM_FIELDS[6:] if f in given})
        elif given:  # dataclasses.replace(cell, heads=...)
            problem = dataclasses.replace(problem, **given)
        values = {"mode": "fwd", **DEFAULTS, **kw}
        values["soft_cap"] = None if values["soft_cap"] is None else float(values["soft_cap"])
        values.update(kv_cells.cell_fields(values["kv_dtype"], values["kv_scale"]))
        for name, value in (("backend", backend), ("problem", problem), *values.items()):
            object.__setattr__(self, name, value)
        self._validate()

    def _validate(self):
        if self.inputs not in DISTRIBUTIONS:
            raise ValueError(f"inputs must be one of {DISTRIBUTIONS}, got {self.inputs!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.lengths is not None:
            if self.lengths not in LENGTHS and not serving_cell.is_serving(self):
                raise ValueError(f"lengths must be None, one of {LENGTHS + serving_cell.LENGTHS} or file:PATH, "
                                 f"got {self.lengths!r}")
            if self.q_len > self.kv_len or self.strategy is not None:
                raise ValueError("decode cells (lengths) need q_len <= kv_len and no strategy")
        if (self.lengths == "paged") != (self.page_size is not None) and not serving_cell.is_serving(self):
            raise ValueError(f"page_size is given exactly for lengths 'paged' (or serving), got lengths={self.lengths!r}, "
                             f"page_size={self.page_size!r}")
        if self.page_size is not None and (self.page_size < 1 or self.kv_len % self.page_size):
            raise ValueError(f"page_size must divide kv_len={self.kv_len}, got {self.page_size}")
        check_soft_cap(self.soft_cap)       # None passes
        serving_cell.check_cell(self)
        if self.packing is not None:
            segments.parse_packing(self.packing)
            if self.q_len != self.kv_len or self.lengths is not None or self.strategy is not None:
                raise ValueError("packing needs q_len == kv_len, no decode lengths and no strategy")
        kv_cells.validate(self)
        if self.strategy is not None and self.strategy not in strategies.names():
            raise ValueError(strategies.unknown(self.strategy))
        if self.strategy is None and self.devices != 1:
            raise ValueError("devices > 1 needs a strategy (batch, heads or ring)")
        if self.strategy is not None and (self.soft_cap is not None or self.sinks):
            raise ValueError("a strategy takes no soft cap and no sinks (sharded_attention has neither)")

    def kv_lengths(self) -> tuple[int, ...] | None:
        """Decode cells: each sequence's valid cache length (the q_len new tokens included), drawn once with the
        cell's ``workload``.

        "full": every sequence fills the cache (S). "ragged": lengths drawn uniformly from [T, S]
        with a seed fixed by the shape, so every backend and every run sees the same batch. A serving cell:
        every request's, the prefill chunks first."""
        return self.workload.kv_lengths

    def _decode_lengths(self) -> tuple[int, ...] | None:
        if self.lengths is None or self.lengths in ("full", "paged"):
            return None if self.lengths is None else (self.kv_len,) * self.batch
        rng = np.random.default_rng(seed_of(f"ragged B{self.batch} T{self.q_len} S{self.kv_len}"))
        return tuple(int(x) for x in rng.integers(self.q_len, self.kv_len + 1, size=self.batch))

    def segment_ids(self) -> np.ndarray | None:
        """(B, T) int32 ids of ``packing`` ("docs:N": N contiguous documents of random lengths per row,
        seeded by the shape, so every backend and run sees the same packing), or None; drawn once per cell
        (read-only: its workload, call and check share them)."""
        return self._segment_ids

    @functools.cached_property
    def _segment_ids(self) -> np.ndarray | None:
        if (n := segments.parse_packing(self.packing)) is None:
            return None
        ids = segments.docs(self.batch, self.q_len, n, seed_of(f"packing {self.packing} B{self.batch} T{self.q_len}"))
        ids.setflags(write=False)
        return ids

    @functools.cached_property
    def workload(self) -> Problem:
        """The problem with the cell's decode lengths and documents (what its FLOPs and bytes count), made once
        per cell (a serving cell draws its requests for it)."""
        if serving_cell.is_serving(self):
            return serving_cell.problem_of(self)
        docs = segments.run_lengths(self.segment_ids()) if self.packing else None   # packed: pairs within documents
        return dataclasses.replace(self.problem, kv_lengths=self._decode_lengths(), decode=self.lengths is not None,
                                   doc_lengths=docs, kv_dtype=self.kv_dtype, kv_scale=self.kv_scale,
                                   page_size=self.page_size)

    def identity(self) -> dict:
        """The record's identity fields in order, the problem's as ``Problem.identity`` spells them."""
        return {**{k: getattr(self, k) for k in IDENTITY}, **self.problem.identity()}

    def key(self) -> str:
        return json.dumps(self.identity(), sort_keys=True)

    @property
    def config_label(self) -> str:
        return config_label(self.identity())


#: Read in records written before the field existed as this default (``record_key``).
_SINCE = {"record_default": True}
Cell = dataclasses.make_dataclass(
    "Cell", [("backend", str), ("problem", Problem), ("mode", str, dataclasses.field(default="fwd")),
             *((f.name, f.type, dataclasses.field(default=f.default, metadata=_SINCE)) for f in CELL_FIELDS)],
    bases=(_CellMethods,), namespace={"__doc__": _CellMethods.__doc__, "__module__": __name__}, frozen=True, init=False)

#: A record's identity: the Cell's fields in order, its problem spelled out as the Problem's fields.
IDENTITY = tuple(n for f in dataclasses.fields(Cell) for n in (PROBLEM_FIELDS if f.name == "problem" else (f.name,)))
#: Identity fields older records may lack, read as the Cell's defaults.
IDENTITY_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Cell) if f.metadata.get("record_default")}


def record_key(rec: dict) -> str:
    d = {k: rec.get(k, IDENTITY_DEFAULTS.get(k)) for k in IDENTITY}
    d["window"] = list(d["window"]) if d["window"] else None
    return json.dumps(d, sort_keys=True)


