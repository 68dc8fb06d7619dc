"""An output's and its gradients' errors against both references: the reference side of a cell's check.

``output_errors(out, q, k, v, sem, key)`` and ``grad_errors(grads, q, k, v, cotangent, sem, key)`` take what a
call returned, its input set, its mask rules (``Semantics``) and the identity of its problem and inputs (``key``),
and return the errors that ``attnlab.measure.check`` judges by the tolerance policy:

- **float32 on the device** (``attnlab.reference.blockwise``, ``precision=HIGHEST``): the *whole* output (and
  every gradient) against it, beside its kernel-like emulation's errors (the policy's baselines).
- **NumPy float64** (``attnlab.reference.float64``): a sample of query rows (``sample_rows``): the first and the
  last tile, ``INTERIOR_TILES`` interior tiles and up to three batch elements (the first, the last and one drawn
  at random), drawn from a seed derived from ``key`` (not from Python's ``hash``), so every backend of one
  problem is checked on the same rows.

The output's structure, shape and dtype and the rows that see no key follow ``attnlab.reference.rules`` (an empty
row is never a false ``incorrect``). Each device step is one program compiled once per shape without GPU autotuning
(``attnlab.reference.compiled``; compiled ahead from ``check_programs.check_compiles``): the reference with its
emulation and the rows that see no key; an output's errors under the empty-row rule (the emulation's, the baselines,
by the same program); the gradients' likewise. The references are shared by every backend and mode measured on the
same inputs (``compiled.computed_once``), so a cell pays one comparison of its own output; the seconds of the
references it made are returned (``parts``).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from . import rules
from .check_programs import batch_rows, grad_references, judge_grads, judge_output, references
from .compiled import compiled_once, computed_once
from .float64 import reference_attention
from .inputs import seed_of

TILE = 64
INTERIOR_TILES = 2


@dataclasses.dataclass(frozen=True)
class Semantics:
    """What the output must mean: the mask rules of the call (see ``attnlab.reference.blockwise``)."""

    causal: bool = False
    window: tuple[int, int] | None = None
    kv_lengths: tuple[int, ...] | None = None       # (B,) valid key lengths
    q_offsets: tuple[int, ...] | None = None        # (B,) position of query row 0 (decode: kv_len - T)
    soft_cap: float | None = None                   # logits_soft_cap
    segment_ids: np.ndarray | None = None           # (B, T) packed ids of a self-attention cell (T == S)
    sinks: np.ndarray | None = None                 # (N,) float32 attention sinks
    q_lengths: tuple[int, ...] | None = None        # (B,) valid query rows (the rest are padding: 0 by rule)

    def device_kwargs(self, T: int) -> dict:
        """The device programs' keyword arguments: the rules, and the lengths, positions and ids as int32 arrays."""
        return {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in self._kwargs(T).items()}

    def device_shapes(self, T: int) -> dict:
        """``device_kwargs`` with ``jax.ShapeDtypeStruct`` in place of the arrays (to compile ahead)."""
        return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) if isinstance(v, np.ndarray) else v
                for k, v in self._kwargs(T).items()}

    def _kwargs(self, T: int) -> dict:
        kw: dict = dict(causal=self.causal, window=self.window, soft_cap=self.soft_cap)
        if self.segment_ids is not None:
            kw["q_segments"] = kw["kv_segments"] = np.asarray(self.segment_ids, np.int32)
        if self.sinks is not None:
            kw["sinks"] = np.asarray(self.sinks, np.float32)
        if self.kv_lengths is not None:
            kw["kv_lengths"] = np.asarray(self.kv_lengths, np.int32)
        if self.q_lengths is not None:
            kw["q_lengths"] = np.asarray(self.q_lengths, np.int32)
        if self.q_offsets is not None:
            kw["q_positions"] = (np.asarray(self.q_offsets, np.int32)[:, None] + np.arange(T, dtype=np.int32)[None])
        return kw

    def numpy_kwargs(self, batch_idx, rows) -> dict:
        """``reference_attention``'s keyword arguments for the query ``rows`` of the batch elements ``batch_idx``."""
        kw: dict = dict(is_causal=self.causal, local_window_size=self.window, logits_soft_cap=self.soft_cap)
        if self.sinks is not None:
            kw["sinks"] = np.asarray(self.sinks, np.float32)
        if self.segment_ids is not None:
            ids = np.asarray(self.segment_ids)[np.asarray(batch_idx)]
            kw["query_segment_ids"], kw["key_value_segment_ids"] = ids[:, np.asarray(rows)], ids
        pos = np.asarray(rows)[None, :]
        if self.q_offsets is not None:
            pos = np.asarray(self.q_offsets)[batch_idx][:, None] + pos
        kw["query_positions"] = pos
        if self.kv_lengths is not None:
            kw["key_value_seq_lengths"] = np.asarray(self.kv_lengths)[batch_idx]
        return kw


@dataclasses.dataclass(frozen=True)
class Errors:
    """An output's (rel L2, worst row) errors against one reference, beside the emulation's (the baselines);
    ``empty``: how the rows that see no key were compared (``rules.EmptyRows``, its target dropped)."""

    rel_err: float
    row_err: float
    baseline: float
    row_baseline: float
    empty: rules.EmptyRows


def sample_rows(seed: int, B: int, T: int, tile: int = TILE, interior: int = INTERIOR_TILES):
    """(batch indices, query row indices) checked against float64: first and last tile of rows,
    ``interior`` random interior tiles, batch elements 0, B-1 and one drawn at random."""
    rng = np.random.default_rng(seed)
    starts = {0, max(0, T - tile)}
    if T > 2 * tile:
        starts |= {int(x) for x in rng.integers(tile, T - tile, size=interior)}
    rows = sorted({r for s in starts for r in range(s, min(T, s + tile))})
    batch = {0, B - 1}
    if B > 2:
        batch.add(int(rng.integers(1, B - 1)))
    return sorted(batch), np.asarray(rows, np.int64)


def output_errors(out, q, k, v, sem: Semantics, key: str) -> dict:
    """The errors of the forward output ``out`` (B, T, N, H) of inputs q (B, T, N, H), k, v (B, S, K, H):
    {"float32_device": Errors of the whole output, "float64_rows": Errors of the sampled rows, "max_abs_err"
    (whole output), "batch" (sampled batch indices), "rows" (sampled rows a batch element), "fraction" (of all
    rows), "parts" (seconds of the references made: reference_s, float64_rows_s)}.
    ``OutputMismatchError`` unless ``out`` is one array of exactly that shape and q's dtype (``rules``)."""
    B, T = q.shape[:2]
    batch_idx, rows = sample_rows(seed_of(key), B, T)
    bi, dkw, nkw, parts = np.asarray(batch_idx), sem.device_kwargs(T), sem.numpy_kwargs(batch_idx, rows), {}
    rules.require_like(out, "out", q.shape[:-1] + v.shape[-1:], q.dtype, "the query's, with the value's head dim")
    take = lambda x: np.asarray(x)[bi][:, rows].astype(np.float64)  # noqa: E731  (on the host: no gather to compile)

    def reference():
        ref32, emul, empty = compiled_once(references, q, k, v, **dkw)
        (b_err, b_row, _), _ = jax.device_get(compiled_once(judge_output, emul, ref32, v, empty))
        return ref32, (float(b_err), float(b_row)), take(emul), np.asarray(empty)

    ref32, (b_err, b_row), e64, empty = computed_once(("fwd", key), reference, parts, "reference_s")
    (err, row, mx), as_zero = jax.device_get(compiled_once(judge_output, out, ref32, v, jnp.asarray(empty)))
    n_empty, as_zero = int(np.sum(empty)), int(as_zero)
    dev = Errors(float(err), float(row), b_err, b_row,
                 rules.EmptyRows(None, n_empty, as_zero, n_empty * out.shape[2] - as_zero))
    empty64 = empty[bi][:, rows][:, :, None]                  # (sampled batch, rows, 1): the same rule

    def rows64():
        # K and V: only the sampled batch elements leave the device (a long cache is GiBs), as float32
        idx = jnp.asarray(bi, jnp.int32)
        kb, vb = (np.asarray(compiled_once(batch_rows, x, idx)) for x in (k, v))
        qs = np.asarray(q)[bi][:, rows].astype(kb.dtype)
        if sem.q_lengths is None:
            ref64 = reference_attention(qs, kb, vb, **nkw)
        else:   # each element's rows below its length only (sorted: a prefix); the padding rows past it are 0
            ref64 = np.zeros(qs.shape[:-1] + vb.shape[-1:])
            for j, b in enumerate(batch_idx):
                if n := int(np.searchsorted(rows, sem.q_lengths[b])):
                    ref64[j, :n] = reference_attention(qs[j:j + 1, :n], kb[j:j + 1], vb[j:j + 1],
                                                       **sem.numpy_kwargs([b], rows[:n]))[0]
        return ref64, rules.errors_past_empty_rows(e64, ref64, empty64)[:2]

    ref64, (e_l2, e_row) = computed_once(("f64", key), rows64, parts, "float64_rows_s")
    o_l2, o_row, t64 = rules.errors_past_empty_rows(take(out), ref64, empty64)
    sampled = Errors(o_l2, o_row, e_l2, e_row, dataclasses.replace(t64, target=None))
    return {"float32_device": dev, "float64_rows": sampled, "max_abs_err": float(mx), "batch": batch_idx,
            "rows": int(rows.size), "fraction": rows.size * len(batch_idx) / (T * B), "parts": parts}


def grad_errors(grads, q, k, v, cotangent, sem: Semantics, key: str) -> dict:
    """{"dq"|"dk"|"dv": (rel L2, worst row, the emulation's rel L2, its worst row)} of (dq, dk, dv) of sum(out *
    cotangent) against the float32 reference's; a row that sees no key may follow either convention (``rules``).
    ``OutputMismatchError`` unless ``grads`` is three arrays shaped and typed as q, k and v."""
    dkw = sem.device_kwargs(q.shape[1])
    rules.require_grads(grads, q, k, v)
    ct = jnp.asarray(cotangent).astype(q.dtype)

    def reference():
        refs, emuls, empty = compiled_once(grad_references, q, k, v, ct, **dkw)
        return refs, jax.device_get(compiled_once(judge_grads, *emuls, *refs, ct, empty)), empty

    refs, bases, empty = computed_once(("grad", key), reference)
    errs = jax.device_get(compiled_once(judge_grads, *grads, *refs, ct, empty))
    return {name: (*map(float, e), *map(float, b)) for name, e, b in zip(("dq", "dk", "dv"), errs, bases)}
