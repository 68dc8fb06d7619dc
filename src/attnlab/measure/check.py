"""Is a cell's answer right? The whole output and every gradient, against two references, one policy.

- **float32 on the device** (``attnlab.reference.blockwise``, blockwise, ``precision=HIGHEST``): the
  *whole* output is compared with it, and for fwd+bwd / bwd cells the whole dq, dk and dv.
- **NumPy float64** (``attnlab.reference.float64``): a sample of query rows — the first and the last tile,
  ``INTERIOR_TILES`` interior tiles and up to three batch elements (the first, the last and one
  drawn at random), drawn from a seed derived from the cell's problem (not from Python's ``hash``),
  so every backend of one problem is checked on the same rows.

The policy (``attnlab.reference.tolerance.policy_limit``; in words, once: docs/measuring.md "Tolerance policy")
applies to each error: relative L2 over the whole tensor and, for outputs, the worst row's. Shapes, dtypes
and rows that see no key follow ``attnlab.reference.rules`` (an empty row is never a false ``incorrect``).
Backends that compute in float8 set their own fixed limit.
References are shared by every backend and mode measured on the same inputs (``ref_key``): the float32
reference and its emulation come from one compiled program (``blockwise_pair``, compiled once per shape
without GPU autotuning, for the whole process: ``attnlab.reference.compiled``; on a GPU compiled ahead
by ``attnlab.measure.prefetch``), and the emulation's errors (the policy's baselines) and the float64
rows are computed once per inputs; a cell then pays one comparison of its own output. The seconds of
the references a cell made go to its ``check_parts_s``. The references of the
last ``_CACHE_SIZE`` input sets are kept (``_CACHE_BYTES`` at most, the newest always).
``check_into`` applies the policy to a cell (its output, then its gradients) and records the verdict's fields.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np

from ..reference.blockwise import batch_rows, blockwise_grads_pair, blockwise_pair, empty_rows, rel_errors
from ..reference.compiled import compiled_once
from ..reference.float64 import reference_attention
from ..reference.inputs import seed_of
from ..core.errors import OutputMismatchError
from ..reference import rules
from ..reference.tolerance import policy_limit, rel_l2, row_rel_err
from . import kv_cells
from .outcome import Skip, Status
from .verdict import errors_text, judged, output_dtype, policy_verdict, rule_text  # noqa: F401

TILE = 64
INTERIOR_TILES = 2
_CACHE: OrderedDict = OrderedDict()   # ref_key -> {"fwd": ..., "f64": ..., "grad": ...}
_CACHE_SIZE = 8
_CACHE_BYTES = 2 * 2**30


@dataclasses.dataclass(frozen=True)
class Semantics:
    """What the output must mean: the mask rules of the cell (see ``attnlab.reference.blockwise``)."""

    causal: bool = False
    window: tuple[int, int] | None = None
    kv_lengths: tuple[int, ...] | None = None       # (B,) valid key lengths
    q_offsets: tuple[int, ...] | None = None        # (B,) position of query row 0 (decode: kv_len - T)
    soft_cap: float | None = None                   # logits_soft_cap
    segment_ids: np.ndarray | None = None           # (B, T) packed ids of a self-attention cell (T == S)
    sinks: np.ndarray | None = None                 # (N,) float32 attention sinks

    def device_kwargs(self, T: int) -> dict:
        """``blockwise_pair``'s keyword arguments: the rules, and the lengths, positions and ids as int32 arrays."""
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
        if self.q_offsets is not None:
            kw["q_positions"] = (np.asarray(self.q_offsets, np.int32)[:, None] + np.arange(T, dtype=np.int32)[None])
        return kw

    def numpy_kwargs(self, batch_idx, rows) -> dict:
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


def _nbytes(x) -> int:
    return sum(int(getattr(a, "nbytes", 0)) for a in jax.tree_util.tree_leaves(x))


def _cached(key, make):
    """``make()`` of ``key`` = (kind, ref_key), kept with the other kinds of the same ref_key."""
    kind, rk = key
    entry = _CACHE.setdefault(rk, {})
    _CACHE.move_to_end(rk)
    if kind not in entry:
        entry[kind] = make()
        while len(_CACHE) > 1 and (len(_CACHE) > _CACHE_SIZE or sum(map(_nbytes, _CACHE.values())) > _CACHE_BYTES):
            _CACHE.popitem(last=False)
    return entry[kind]


def _timed(parts: dict, name: str, make):
    """``make``, its wall seconds put in ``parts[name]`` when it runs (a cached reference is not made)."""
    def run():
        t0 = time.perf_counter()
        out = make()
        parts[name] = round(time.perf_counter() - t0, 4)
        return out
    return run


def clear_cache() -> None:
    _CACHE.clear()


def check_forward(out, q, k, v, sem: Semantics, *, ref_key: str, fixed_limit: float | None = None,
                  fixed_rule: str | None = None) -> dict:
    """Record fields for the forward output ``out`` (B, T, N, H) of inputs q, k, v (see module doc);
    ``OutputMismatchError`` unless ``out`` is one array of exactly that shape and q's dtype."""
    B, T = q.shape[:2]
    batch_idx, rows = sample_rows(seed_of(ref_key), B, T)
    dkw, nkw = sem.device_kwargs(T), sem.numpy_kwargs(batch_idx, rows)   # the rules, as each reference takes them
    rules.require_like(out, "out", q.shape[:-1] + v.shape[-1:], q.dtype, "the query's, with the value's head dim")
    dtype = np.dtype(out.dtype).name
    bi = np.asarray(batch_idx)
    host = lambda x: np.asarray(x)[bi]          # noqa: E731  (indexed on the host: no gather to compile)
    take = lambda x: host(x)[:, rows].astype(np.float64)  # noqa: E731

    def reference():
        ref32, emul, empty = blockwise_pair(q, k, v, **dkw)
        return ref32, rel_errors(emul, ref32)[:2], take(emul), np.asarray(empty)

    parts: dict = {}      # seconds of the references made for this cell (none when all were cached)
    ref32, (b_err, b_row), e64, empty = _cached(("fwd", ref_key), _timed(parts, "reference_s", reference))
    dev_empty = rules.empty_row_target_device(out, ref32, v, empty) if empty.any() else rules.EmptyRows(ref32)
    err, row, mx = rel_errors(out, dev_empty.target)
    dev = policy_verdict(err, row, b_err, b_row, dtype, fixed_limit)
    dev.update(reference="float32 blockwise on the device, precision HIGHEST", fraction=1.0,
               empty_rows=dev_empty.rows, empty_note=dev_empty.note or None)
    empty64 = empty[bi][:, rows][:, :, None]                  # (sampled batch, rows, 1): the same rule

    def rows64():
        # K and V: only the sampled batch elements leave the device (a long cache is GiBs), as float32
        idx = jnp.asarray(bi, jnp.int32)
        kb, vb = (np.asarray(compiled_once(batch_rows, x, idx)) for x in (k, v))
        ref64 = reference_attention(host(q)[:, rows].astype(kb.dtype), kb, vb, **nkw)
        e_target = rules.empty_row_target(e64, ref64, empty64).target
        return ref64, rel_l2(e64, e_target), row_rel_err(e64, e_target)

    ref64, e_l2, e_row = _cached(("f64", ref_key), _timed(parts, "float64_rows_s", rows64))
    o64 = take(out)
    t64 = rules.empty_row_target(o64, ref64, empty64)
    f64 = policy_verdict(rel_l2(o64, t64.target), row_rel_err(o64, t64.target), e_l2, e_row, dtype, fixed_limit)
    f64.update(reference="NumPy float64 on sampled rows", batch=batch_idx, rows=int(rows.size),
               fraction=rows.size * len(batch_idx) / (T * B), empty_rows=t64.rows, empty_note=t64.note or None)
    ok = dev["ok"] and f64["ok"]
    rule = rule_text(dtype, fixed_limit, fixed_rule) + (f"; {dev_empty.note}" if dev_empty.rows else "")
    return {"ok": ok, "checked_fraction": 1.0, "rel_err": err, "row_err": row, "max_abs_err": mx,
            "rel_err_f64": f64["rel_err"], "margin": min(dev["margin"], f64["margin"]),
            "tolerance": rule,
            "checks": {"float32_device": dev, "float64_rows": f64}, "check_parts_s": parts or None,
            "reason": None if ok else _why(dev, f64)}


def _why(dev, f64) -> str:
    return "; ".join(f"{name}: {errors_text(c)}" for name, c in (("whole output vs float32", dev),
                                                                   ("sampled rows vs float64", f64)) if not c["ok"])


def check_grads(grads, q, k, v, cotangent, sem: Semantics, *, ref_key: str) -> dict:
    """Record fields for (dq, dk, dv) of sum(out * cotangent), all of each tensor checked.

    ``cotangent`` is the cotangent the backend's output received (in the output's dtype)."""
    dtype, dkw = np.dtype(q.dtype).name, sem.device_kwargs(q.shape[1])
    rules.require_grads(grads, q, k, v)
    ct = jnp.asarray(cotangent).astype(q.dtype)

    def reference():
        refs, emuls = blockwise_grads_pair(q, k, v, ct, **dkw)
        return refs, [rel_errors(e, r)[0] for e, r in zip(emuls, refs)]

    refs, bases = _cached(("grad", ref_key), reference)
    fwd = _CACHE.get(ref_key, {}).get("fwd")
    empty = fwd[3] if fwd else np.asarray(compiled_once(empty_rows, q, k, **dkw))
    per = {}
    for name, g, rs, base in zip(("dq", "dk", "dv"), grads, rules.grad_targets(refs, ct, empty), bases):
        err = min(rel_errors(g, r)[0] for r in rs)     # rows that see no key: either convention (reference.rules)
        limit = policy_limit(dtype, base)
        per[name] = {"rel_err": err, "limit": limit, "baseline": base, "ok": bool(err <= limit)}
    ok = all(p["ok"] for p in per.values())
    bad = [f"{n} rel L2 {p['rel_err']:.3g} > {p['limit']:.3g}" for n, p in per.items() if not p["ok"]]
    return {"grad_check": "ok" if ok else "incorrect", "grad_rel_err": max(p["rel_err"] for p in per.values()),
            "grad_checked_fraction": 1.0, "grad_checks": per,
            "grad_margin": min(p["limit"] / p["rel_err"] if p["rel_err"] > 0 else math.inf for p in per.values()),
            "grad_reason": None if ok else "gradient wrong: " + "; ".join(bad)}


def device_array(x):
    """A JAX array on the default device (outputs of non-JAX backends arrive by DLPack)."""
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


# --- the check of a cell (``attnlab.measure.cell``): its semantics, reference key and verdicts --------

def ref_key(cell, seed: int) -> str:
    """The identity of a cell's problem and inputs: every backend and mode of it shares references, and
    a paged cell its contiguous twin's (the same inputs and lengths, only laid out in pages)."""
    ident = {k: v for k, v in cell.identity().items() if k not in ("backend", "mode", "page_size")}
    if ident.get("lengths") == "paged":
        ident["lengths"] = "full"
    return json.dumps({**ident, "seed": seed}, sort_keys=True)


def semantics(cell, extras: dict) -> Semantics:
    """The cell's mask rules; ``extras``: its call's keyword arguments (``inputs.call_extras``), whose sinks and
    segment ids the references take."""
    lens = cell.kv_lengths()
    sinks = None if extras.get("sinks") is None else np.asarray(extras["sinks"])
    if lens is None:
        return Semantics(causal=cell.causal, window=cell.window, soft_cap=cell.soft_cap,
                         segment_ids=extras.get("query_segment_ids"), sinks=sinks)
    return Semantics(causal=cell.causal, window=cell.window, kv_lengths=lens,
                     q_offsets=tuple(n - cell.q_len for n in lens), soft_cap=cell.soft_cap, sinks=sinks)


def check_into(rec: dict, out, inputs, cell, backend, opts, extras: dict, grads=None, ct=None) -> None:
    """Check a (non-serving) cell into ``rec``: its whole forward output ``out`` on its first input set ``inputs``
    (q, k, v; a quantized cache: ``kv_cells.check_output``), then, for fwd+bwd / bwd cells, every gradient
    (``grads()`` makes them once the output passed; ``ct`` the output's cotangent); ``extras``: the call's keyword
    arguments. ``Skip('incorrect')`` carrying the fields of the check that failed; first, for every cell, an
    output of another dtype than the cell's (``output_dtype``)."""
    rec.update(output_dtype(out, cell))
    if not cell.kv_dtype:
        sem, key = semantics(cell, extras), ref_key(cell, opts.seed)
        rec.update(check_output(out, inputs, cell, backend, sem, key))
        if grads is not None:
            rec.update(check_gradients(grads(), inputs, ct, sem, key))
    else:
        rec.update(kv_cells.check_output(out, inputs, cell, extras))


def check_output(out, inputs, cell, backend, sem: Semantics, key: str) -> dict:
    """The record fields of the check of the whole forward output (of the cell's dtype: ``check_into``);
    ``Skip('incorrect')`` carrying them when it fails."""
    fields: dict = {}
    try:
        chk = check_forward(device_array(out), *inputs, sem, ref_key=key,
                            fixed_limit=backend.rel_l2_limit, fixed_rule=backend.rel_l2_rule)
    except OutputMismatchError as e:
        raise Skip(Status.INCORRECT, f"output wrong: {e}", fields) from None
    ok, why = chk.pop("ok"), chk.pop("reason")
    fields.update(chk)
    if not ok:
        raise Skip(Status.INCORRECT, f"output wrong: {why} ({chk['tolerance']})", fields)
    return fields


def check_gradients(grads, inputs, ct, sem: Semantics, key: str) -> dict:
    """The record fields of the check of every gradient; ``Skip('incorrect')`` carrying them when one fails."""
    q, k, v = inputs
    try:
        chk = check_grads(grads, q, k, v, ct.astype(q.dtype), sem, ref_key=key)
    except OutputMismatchError as e:
        raise Skip(Status.INCORRECT, f"gradient wrong: {e}") from None
    if (why := chk.pop("grad_reason")) is not None:
        raise Skip(Status.INCORRECT, why, chk)
    return chk
