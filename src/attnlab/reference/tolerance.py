"""The tolerance policy's numbers and measures, apart from any reference: errors, limits, verdicts.

``rel_l2`` and ``row_rel_err`` measure an output against a reference in float64; ``policy_limit`` and
``tolerance`` give the limit (``LIMIT_FACTOR`` x the kernel-like emulation's error + the dtype's
floor, ``FLOORS``); ``Verdict`` holds a judgement; ``policy_verdict`` judges (rel L2, worst row) errors as a
cell's record gives them (``attnlab.measure.check``, ``serving_cell``), ``rule_text`` and ``errors_text`` say
the rule and the errors in words. The policy in words, written once, is
docs/measuring.md ("Tolerance policy"); ``attnlab.reference.float64.check_close`` applies it.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np


def rel_l2(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (inf when out has NaN/Inf)."""
    out, ref = (np.asarray(x).astype(np.float64) for x in (out, ref))
    if not np.all(np.isfinite(out)):
        return math.inf
    num, denom = np.linalg.norm(out - ref), np.linalg.norm(ref)
    return float(num / denom) if denom > 0 else float(num)


def row_rel_err(out, ref, row_axes: int = 2) -> float:
    """The worst row's relative L2 error: rows are the first ``row_axes`` axes ((B, T) of (B, T, N, H)).

    A row whose reference is (near) zero is judged against 1e-3 of the mean row norm, so a zeroed
    padded row that should be zero counts 0 and one that is not counts large."""
    out, ref = (np.asarray(x).astype(np.float64) for x in (out, ref))
    if not np.all(np.isfinite(out)):
        return math.inf
    if ref.size == 0:
        return 0.0
    lead = int(np.prod(ref.shape[:row_axes]))
    d = np.linalg.norm((out - ref).reshape(lead, -1), axis=1)
    r = np.linalg.norm(ref.reshape(lead, -1), axis=1)
    floor = max(1e-3 * float(r.mean()), 1e-30)
    return float(np.max(d / np.maximum(r, floor)))


@dataclasses.dataclass(frozen=True)
class Verdict:
    ok: bool
    rel_err: float
    limit: float
    max_abs_err: float
    rule: str
    row_err: float = 0.0
    row_limit: float = math.inf
    empty_rows: int = 0                 # query rows that see no key (attnlab.reference.rules)
    note: str = ""                      # how they were compared: "3 rows see no key: compared as zeros"
    lse_err: float | None = None        # with return_residual=True: the worst row's lse error ...
    lse_limit: float | None = None      # ... and its limit

    def __bool__(self) -> bool:
        return self.ok

    @property
    def margin(self) -> float:
        """How many times each error could grow before failing (the smallest ratio); < 1 fails."""
        pairs = [(self.rel_err, self.limit), (self.row_err, self.row_limit)]
        if self.lse_err is not None:
            pairs.append((self.lse_err, self.lse_limit))
        return min(lim / err if err > 0 else math.inf for err, lim in pairs)


def default_matmul_is_tf32() -> bool:
    """True when JAX's float32 matmuls on the default device run in TF32 (GPU, default precision)."""
    import jax  # heavy: jax, reference.tolerance imports no JAX

    if jax.default_backend() != "gpu":
        return False
    prec = jax.config.jax_default_matmul_precision
    return prec is None or str(prec).lower() in ("default", "bfloat16", "tensorfloat32", "fastest")


#: The limit is this many times the kernel-like emulation's error ...
LIMIT_FACTOR = 2.0
#: ... plus this floor, by output dtype.
FLOORS = {"float64": 1e-10, "float32": 1e-5, "bfloat16": 1e-4, "float16": 1e-4}
#: float32 on a GPU at default precision (TF32: 10-bit mantissa) when no emulation is at hand.
TF32_LIMIT = 2e-3


def policy_limit(dtype, baseline_err: float) -> float:
    """The tolerance policy: 2 x the kernel-like emulation's error in ``dtype`` + the dtype's floor."""
    return LIMIT_FACTOR * float(baseline_err) + FLOORS[np.dtype(dtype).name]


def tolerance(dtype, *, baseline_err: float | None = None, tf32: bool | None = None) -> tuple[float, str]:
    """(limit on relative L2 error, the rule in words) for outputs of ``dtype``.

    ``baseline_err``: the kernel-like emulation's error in that dtype (needed for bf16/fp16; for
    float32/float64 the emulation is the computation itself and 0 is assumed when not given)."""
    name = np.dtype(dtype).name
    if name == "float32":
        if tf32 is None:
            tf32 = default_matmul_is_tf32()
        if tf32 and baseline_err is None:
            return TF32_LIMIT, f"float32 with TF32 matmuls (GPU default precision): rel L2 <= {TF32_LIMIT:g}"
    if name in ("float32", "float64") and baseline_err is None:
        baseline_err = 0.0
    if baseline_err is None:
        raise ValueError(f"{name} tolerance needs baseline_err: the error of the kernel-like computation in {name}")
    limit = policy_limit(name, baseline_err)
    return limit, f"{name}: error <= {LIMIT_FACTOR:g} x {baseline_err:.2e} (kernel-like emulation in {name}) + {FLOORS[name]:g}"


def policy_verdict(err, row, base, base_row, dtype, fixed_limit) -> dict:
    """The tolerance policy's verdict on (rel L2, worst row) errors given the emulation's (or a fixed limit)."""
    if fixed_limit:
        limit, row_limit = fixed_limit, LIMIT_FACTOR * fixed_limit
    else:
        limit, row_limit = policy_limit(dtype, base), policy_limit(dtype, base_row)
    ok = bool(err <= limit and row <= row_limit)
    margin = min(limit / err if err > 0 else math.inf, row_limit / row if row > 0 else math.inf)
    return {"rel_err": err, "row_err": row, "limit": limit, "row_limit": row_limit, "baseline": base,
            "row_baseline": base_row, "margin": margin, "ok": ok}


def rule_text(dtype: str, fixed_limit: float | None, fixed_rule: str | None) -> str:
    """The rule ``policy_verdict`` applied, in words (a backend's own rule for its fixed limit)."""
    if fixed_limit:
        return fixed_rule or f"fixed limit: rel L2 <= {fixed_limit:g}, worst row <= {LIMIT_FACTOR * fixed_limit:g}"
    return (f"{dtype}: rel L2 and worst-row error <= {LIMIT_FACTOR:g} x the kernel-like emulation's "
            f"(scores f32, P rounded to {dtype}, f32 accumulation) + floor")


def errors_text(c: dict) -> str:
    """A verdict's errors beside their limits: "rel L2 E (limit L)[, worst row E (limit L)]"."""
    row = f", worst row {c['row_err']:.3g} (limit {c['row_limit']:.3g})" if c.get("row_limit") is not None else ""
    return f"rel L2 {c['rel_err']:.3g} (limit {c['limit']:.3g})" + row
