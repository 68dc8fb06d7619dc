"""Is a cell's answer right? The tolerance policy applied to its errors, as the cell's record gives it.

The errors come from the reference side in one call each (``attnlab.reference.output_errors``): the *whole*
output (and for fwd+bwd / bwd cells the whole dq, dk and dv) against attnlab's blockwise float32 reference on
the device, and sampled rows against NumPy float64, references shared by every backend and mode measured on the
same inputs (``ref_key``) and the seconds of those a cell made in its ``check_parts_s``; a serving step's sampled
requests against float64 (``attnlab.reference.serving64.serving_errors``). A quantized KV cache's check:
``kv_cells.check_output``. The policy (``attnlab.reference.tolerance.policy_limit``; in words, once:
docs/measuring.md "Tolerance policy") applies to each error: relative L2 over the whole tensor and the worst row's. Backends that compute in float8 set their own fixed limit.

``check_into`` checks every cell's run into its record, before it is timed: its output's dtype
(``output_dtype``), then by the check of its kind (the whole output then its gradients; a quantized cache's; a
serving step's sampled requests: ``check_serving``), the verdict's
fields made as for every check of a cell (``outcome.judged``, ``reference.tolerance.policy_verdict``).
"""
from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..core import request_lengths as rl
from ..core.errors import OutputMismatchError
from ..core.kv_quant import dequantized_cache
from ..reference.output_errors import Semantics, grad_errors, output_errors
from ..reference.serving64 import serving_errors
from ..reference.tolerance import errors_text, policy_verdict, rule_text
from . import kv_cells, serving_cell
from .outcome import Skip, Status, classify, judged


# --- the whole output and every gradient against the references -----------------------------------------

def check_forward(out, q, k, v, sem: Semantics, *, ref_key: str, fixed_limit: float | None = None,
                  fixed_rule: str | None = None) -> dict:
    """Record fields for the forward output ``out`` (B, T, N, H) of inputs q, k, v (``output_errors``);
    ``OutputMismatchError`` unless ``out`` is one array of exactly that shape and q's dtype."""
    e = output_errors(out, q, k, v, sem, ref_key)
    dtype, where = np.dtype(out.dtype).name, {"float32_device": "float32 blockwise on the device, precision HIGHEST",
                                              "float64_rows": "NumPy float64 on sampled rows"}
    checks = {}
    for name, c in ((n, e[n]) for n in where):
        checks[name] = {**policy_verdict(c.rel_err, c.row_err, c.baseline, c.row_baseline, dtype, fixed_limit),
                        "reference": where[name]}
    checks["float32_device"].update(fraction=1.0)
    checks["float64_rows"].update(batch=e["batch"], rows=e["rows"], fraction=e["fraction"])
    for name, c in checks.items():
        c.update(empty_rows=e[name].empty.rows, empty_note=e[name].empty.note or None)
    dev, f64 = checks["float32_device"], checks["float64_rows"]
    ok, note = dev["ok"] and f64["ok"], e["float32_device"].empty.note
    return {"ok": ok, "checked_fraction": 1.0, "rel_err": dev["rel_err"], "row_err": dev["row_err"],
            "max_abs_err": e["max_abs_err"], "rel_err_f64": f64["rel_err"], "margin": min(dev["margin"], f64["margin"]),
            "tolerance": rule_text(dtype, fixed_limit, fixed_rule) + (f"; {note}" if note else ""),
            "checks": checks, "check_parts_s": e["parts"] or None, "reason": None if ok else _why(dev, f64)}


def _why(dev, f64) -> str:
    return "; ".join(f"{name}: {errors_text(c)}" for name, c in (("whole output vs float32", dev),
                                                                   ("sampled rows vs float64", f64)) if not c["ok"])


def check_grads(grads, q, k, v, cotangent, sem: Semantics, *, ref_key: str) -> dict:
    """Record fields for (dq, dk, dv) of sum(out * cotangent), all of each tensor checked (``grad_errors``) by the
    output's policy: rel L2 and worst row each within the emulation's (``policy_verdict``).

    ``cotangent`` is the cotangent the backend's output received (in the output's dtype)."""
    dtype = np.dtype(q.dtype).name
    per = {name: policy_verdict(*errs, dtype, None)
           for name, errs in grad_errors(grads, q, k, v, cotangent, sem, ref_key).items()}
    ok = all(p["ok"] for p in per.values())
    bad = [f"{n} {errors_text(p)}" for n, p in per.items() if not p["ok"]]
    return {"grad_check": "ok" if ok else "incorrect", "grad_rel_err": max(p["rel_err"] for p in per.values()),
            "grad_checked_fraction": 1.0, "grad_checks": per, "grad_margin": min(p["margin"] for p in per.values()),
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


def check_into(rec: dict, run, cell, backend, opts) -> None:
    """Check a cell's ``run`` (``jax_cell.JaxRun``, ``native.NativeRun`` or ``serving_cell.ServingRun``) into ``rec``
    before it is timed: its output on the first input set (``run.output()``), first its dtype (``output_dtype``;
    a serving step's shape too), then by the check of the cell's kind. A serving step: its sampled requests
    (``check_serving``). Any other cell: a quantized cache's check (``kv_cells.check_output`` on the timed caches
    ``run.caches``, then every sequence: ``whole_output``), else the whole output (``check_output``)
    and, for fwd+bwd / bwd cells, every gradient (``check_gradients``: ``run.grads()`` makes them once the output
    passed, ``run.ct`` the output's cotangent). ``Skip('incorrect')`` carrying the fields of the check that
    failed; any other failure of the run or the references ends the cell as ``classify`` says."""
    try:
        out = run.output()
        serving = serving_cell.is_serving(cell)
        # a serving step's output has q's packed rows: its shape is checked too
        rec.update(output_dtype(out, cell, run.contiguous[0].shape if serving else None))
        finite_output(out)
        if serving:
            _, k, v, _, _, table, ks, vs = run.args[0]    # the first timed set: its cache, quantized or not
            rec.update(check_serving(out, run.contiguous, run.q_lens, run.kv_lens, cell, backend, run.sem,
                                     run.dequantized, opts.seed, _dequantized_cache(cell, k, v, ks, vs, table)))
            return
        inputs, extras = run.ins.sets[0], run.ins.extras
        if not cell.kv_dtype:
            sem, key = semantics(cell, extras), ref_key(cell, opts.seed)
            rec.update(check_output(out, inputs, backend, sem, key))
            if run.grads is not None:
                rec.update(check_gradients(run.grads(), inputs, run.ct, sem, key))
        else:   # the sampled sequences against float64, then every one against float32, on the dequantized cache
            fields = kv_cells.check_output(out, inputs, run.caches, cell, extras)
            kc, ks, vc, vs, *table = run.caches
            k, v = _dequantized_cache(cell, kc, vc, ks, vs, *table)
            rec.update(whole_output(fields, [(out, inputs[0], k, v, semantics(cell, extras),
                                              f"{ref_key(cell, opts.seed)}|dequantized")], backend, "every_sequence"))
    except Skip:
        raise
    except Exception as e:  # noqa: BLE001
        raise Skip(*classify(e, "run")) from None


def _dequantized_cache(cell, k, v, k_scale, v_scale, table=None):
    """(k, v) (B, S_max, K, H) float32 (a float64 cell's: float64, as the masked paths read it) on the device of a
    quantized cache and its scales (paged: its ``table``); None for a cache in q's dtype (no scales)."""
    if k_scale is None:
        return None
    work = "float64" if cell.dtype == "float64" else "float32"
    return tuple(dequantized_cache(c, s, cell.kv_scale, table, dtype=work, xp=jnp) for c, s in ((k, k_scale), (v, v_scale)))


def output_dtype(out, cell, shape=None) -> dict:
    """``{"out_dtype": ...}`` of a cell's output; ``Skip('incorrect')`` carrying it when the dtype is not the
    cell's (or, given ``shape``, the shape is not that)."""
    fields = {"out_dtype": np.dtype(out.dtype).name}
    if fields["out_dtype"] != cell.dtype or (shape is not None and tuple(out.shape) != tuple(shape)):
        got, want = (fields["out_dtype"], cell.dtype) if shape is None else (
            f"{fields['out_dtype']} {tuple(out.shape)}", f"{cell.dtype} {tuple(shape)}")
        raise Skip(Status.INCORRECT, f"output {got} is not the cell's {want}", fields)
    return fields


def finite_output(out) -> None:
    """``Skip('incorrect')`` when any value of ``out`` is NaN or Inf: NaN never passes, even where a check
    samples (a serving step's requests, a quantized cache's sequences) would not look."""
    if bad := int(jnp.sum(~jnp.isfinite(device_array(out)))):
        raise Skip(Status.INCORRECT, f"output wrong: {bad} values are NaN or Inf")


def check_output(out, inputs, backend, sem: Semantics, key: str) -> dict:
    """The record fields of the check of the whole forward output (of the cell's dtype: ``check_into``);
    ``Skip('incorrect')`` carrying them when it fails."""
    try:
        chk = check_forward(device_array(out), *inputs, sem, ref_key=key,
                            fixed_limit=backend.rel_l2_limit, fixed_rule=backend.rel_l2_rule)
    except OutputMismatchError as e:
        raise Skip(Status.INCORRECT, f"output wrong: {e}", {}) from None
    ok, why = chk.pop("ok"), chk.pop("reason")
    if not ok:
        raise Skip(Status.INCORRECT, f"output wrong: {why} ({chk['tolerance']})", chk)
    return chk


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


def check_serving(out, contiguous, q_lens, kv_lens, cell, backend, sem: dict, dequantized=None, seed: int = 0,
                  cache=None) -> dict:
    """The record fields of a serving step's check: its output ``out``'s sampled rows against float64
    (``reference.serving64.serving_errors``) on the step's ``contiguous`` (q, k, v, ...) and lengths ``q_lens``,
    ``kv_lens``, with the call's soft cap, window and sinks ``sem`` (``serving_cell.call_semantics``); a
    quantized cache's against its ``dequantized`` values, (k, v) of the sampled requests in order
    (``serving_cell.argument_sets``), with ``kv_rel_err``. Then the whole step: the padding rows past the last
    request 0, and every token of every request (``whole_output``: each group of query lengths, ``length_groups``, as
    a batch of its requests' tokens) against
    the float32 device reference on ``cache`` (k, v) (default the contiguous set's; a quantized cell's, its cache
    dequantized: ``dequantized_cache``). ``Skip('incorrect')`` carrying the fields when one fails."""
    if cell.kv_dtype and dequantized is None:
        raise ValueError("dequantized: a quantized-cache cell's check needs the dequantized K/V of its sampled "
                         "requests (argument_sets makes them)")
    starts = rl.starts_of(q_lens)
    e = serving_errors(out, *contiguous[:3], q_lens, kv_lens, cell.dtype, **sem,
                       dequantized=dequantized if cell.kv_dtype else None)
    fields = dict(checked_fraction=e["fraction"], checked_rows=e["rows"], row_err=e["row_err"],
                  max_abs_err=e["max_abs_err"])
    if cell.kv_dtype:
        fields["kv_rel_err"] = e["kv_rel_err"]
    verdict = policy_verdict(e["rel_err"], e["row_err"], e["baseline"], e["row_baseline"], cell.dtype,
                             backend.rel_l2_limit)
    verdict.update(reference="NumPy float64 (reference.serving64) on the first and last tokens of the longest "
                             "and shortest requests" + (" (the dequantized cache)" if cell.kv_dtype else ""),
                   requests=e["requests"], rows=e["rows"])
    rule = rule_text(cell.dtype, backend.rel_l2_limit, backend.rel_l2_rule)
    fields = judged(fields, "float64_requests", verdict, rule, where=f" on requests {verdict['requests']}")
    if not bool(jnp.all(out[int(starts[-1]):] == 0)):
        raise Skip(Status.INCORRECT, f"output wrong: the padding rows from {int(starts[-1])} are not 0", fields)
    k, v = contiguous[1:3] if cache is None else cache
    q_lens, kv_lens, parts = np.asarray(q_lens), np.asarray(kv_lens), []
    sinks = None if sem.get("sinks") is None else np.asarray(sem["sinks"])
    for reqs in rl.length_groups(q_lens):   # each group of query lengths a batch of its requests' tokens
        idx, keep = (jnp.asarray(x) for x in rl.padded_rows(q_lens[reqs], starts[reqs]))
        batch = lambda x: jnp.where(keep[..., None, None], x[idx], 0).astype(x.dtype)   # noqa: E731  (b, T, N, H)
        rules = Semantics(causal=True, window=cell.window, kv_lengths=tuple(int(n) for n in kv_lens[reqs]),
                          q_offsets=tuple(int(n - t) for n, t in zip(kv_lens[reqs], q_lens[reqs])),
                          q_lengths=tuple(int(t) for t in q_lens[reqs]), soft_cap=cell.soft_cap, sinks=sinks)
        at = jnp.asarray(reqs)
        parts.append((batch(out), batch(contiguous[0]), k[at], v[at], rules,
                      f"{ref_key(cell, seed)}|every token|requests {reqs.tolist()}"))
    return whole_output(fields, parts, backend, "every_token")


def whole_output(fields: dict, parts: list, backend, name: str) -> dict:
    """``fields`` of a check that sampled, with the whole output judged too: ``parts`` (out (B, T, N, H), q, k, v,
    ``Semantics``, reference key) each by ``check_forward``; the verdicts of the failing one (else of the lowest
    margin) in ``checks`` as ``{name}_float32_device`` and ``{name}_float64_rows``, the lowest margin,
    ``checked_fraction`` 1. ``Skip('incorrect')`` carrying them when one fails: a wrong row among those the sample
    missed (a request's middle tokens, an unsampled sequence) fails here."""
    checks = []
    for out, q, k, v, sem, key in parts:
        try:
            checks.append(check_forward(device_array(out), q, k, v, sem, ref_key=key, fixed_limit=backend.rel_l2_limit,
                                        fixed_rule=backend.rel_l2_rule))
        except OutputMismatchError as e:
            raise Skip(Status.INCORRECT, f"output wrong: {e}", fields) from None
        if not checks[-1]["ok"]:
            break
    c = min(checks, key=lambda c: (c["ok"], math.inf if c["margin"] is None else c["margin"]))
    margins = [m for m in (fields.get("margin"), c["margin"]) if m is not None]
    fields = {**fields, "checked_fraction": 1.0, "margin": min(margins) if margins else None,
              "checks": {**fields["checks"], **{f"{name}_{n}": v for n, v in c["checks"].items()}}}
    if not c["ok"]:
        raise Skip(Status.INCORRECT, f"output wrong ({name.replace('_', ' ')}): {c['reason']}", fields)
    return fields
