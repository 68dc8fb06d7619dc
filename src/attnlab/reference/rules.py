"""The checks' rules on an output itself: its structure, exact shape and dtype, the rows that see no
key, and the logsumexp of ``return_residual=True``.

``check_close`` (``float64``), ``check_decode_close`` (``decode64``) and the measuring engine's checks
(``attnlab.reference.output_errors``; on the device: ``check_programs``) apply them before and while
measuring errors; the rules in words, once: docs/measuring.md ("Tolerance policy").

- **Structure, shape, dtype** (``split_output``, ``require_like``): the output is an array (NumPy or
  JAX) shaped exactly as the call returns it and of the query's dtype, nothing broadcast; with
  ``return_residual=True`` it is the pair ``(out, lse)``, lse shaped as the output without its head
  dim. Anything else raises ``OutputMismatchError`` naming the argument and the rule.
- **Rows that see no key** (``empty_row_target``, ``errors_past_empty_rows``): softmax over no key is
  undefined and implementations differ. ``jax.nn.dot_product_attention`` (XLA) gives the mean of V over the keys
  its masks hide, all S where they hide every key (each such logit is the same finite masked value, so its
  softmax is uniform over them; a -inf bias hides the others entirely); naive and flash-style
  kernels give 0. The float64 reference gives jax.nn's value; a check compares each such (row, head)
  with the nearer of the two values (anything else stays wrong) and says so in its note. Padded query
  rows (``query_seq_lengths``, negative segment ids) are not such rows: they are 0, as in jax.nn.
- **Logsumexp** (``lse_error``): per (row, head), |lse - ref| / (1 + |ref|) over the rows that see a
  key. The reference's lse of a row that sees no key (or a padded one) is -inf; an output passes there
  with -inf or any value at or below ``EMPTY_LSE_FRACTION`` of its dtype's masked-logit value
  (jax.nn: -0.7 x the dtype's max capped at float32's, which overflows to -inf in float16).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import ml_dtypes
import numpy as np

from ..core.errors import OutputMismatchError
from ..core.masking import large_negative_value
from .tolerance import FLOORS, rel_l2, row_rel_err

#: An empty row's lse passes at or below this fraction of the dtype's masked-logit value (or at -inf).
EMPTY_LSE_FRACTION = 0.5
JAX_NN_VALUE = "jax.nn's value there (the mean of V over the keys its masks hide)"


def _require_array(x, argument: str) -> None:
    if isinstance(x, (tuple, list)) or not (hasattr(x, "shape") and hasattr(x, "dtype")):
        what = f"a {type(x).__name__} of {len(x)}" if isinstance(x, (tuple, list)) else f"a {type(x).__name__}"
        raise OutputMismatchError(argument, f"must be an array (NumPy or JAX), got {what}")


def split_output(out, return_residual: bool = False, argument: str = "out"):
    """(output array, lse array or None) of what a call returned; raise ``OutputMismatchError`` unless it
    is an array (``return_residual=False``) or the pair (out, lse) (``return_residual=True``)."""
    if not return_residual:
        if isinstance(out, (tuple, list)):
            raise OutputMismatchError(argument, f"must be an array, got a {type(out).__name__} of {len(out)} "
                                      "(to check attention's (out, lse) pair, pass return_residual=True)")
        _require_array(out, argument)
        return out, None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        got = (f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else
               f"one array of shape {tuple(out.shape)}" if hasattr(out, "shape") else f"a {type(out).__name__}")
        raise OutputMismatchError(argument, f"with return_residual=True must be the pair (out, lse) that attention "
                                  f"returns, got {got}")
    _require_array(out[0], f"{argument}[0] (out)")
    _require_array(out[1], f"{argument}[1] (lse)")
    return out[0], out[1]


def require_like(x, argument: str, shape, dtype, what: str) -> None:
    """Raise ``OutputMismatchError`` unless ``x`` is an array of exactly ``shape`` and ``dtype`` (``what``: whose)."""
    _require_array(x, argument)
    if tuple(x.shape) != tuple(shape):
        raise OutputMismatchError(argument, f"must have shape {tuple(shape)} ({what}), got {tuple(x.shape)}")
    want = jax.dtypes.canonicalize_dtype(dtype)     # NumPy float64 without x64 runs (and returns) float32
    if np.dtype(x.dtype) != want:
        raise OutputMismatchError(argument, f"must have dtype {want.name} (the query's, as attention returns it), "
                                  f"got {np.dtype(x.dtype).name}")


def require_grads(grads, q, k, v) -> None:
    """``require_like`` for (dq, dk, dv): a tuple of three arrays shaped and typed as q, k and v."""
    if not isinstance(grads, (tuple, list)) or len(grads) != 3:
        raise OutputMismatchError("grads", f"must be the three arrays (dq, dk, dv), got a {type(grads).__name__}")
    for name, g, x in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        require_like(g, name, x.shape, x.dtype, f"{name[1]}'s")


@dataclasses.dataclass(frozen=True)
class EmptyRows:
    """How the rows that see no key were compared: ``target`` is the reference with each such (row, head)
    set to the nearer of its value and 0; ``rows`` counts query rows with such heads."""

    target: object             # np.ndarray (None where only the counts are kept: ``output_errors``)
    rows: int = 0
    as_zero: int = 0           # (row, head) pairs compared as zeros
    as_jax_nn: int = 0         # ... as jax.nn's value (the reference's)

    @property
    def note(self) -> str:
        """'3 rows see no key: compared as zeros' (empty when there are none)."""
        if not self.rows:
            return ""
        if not self.as_jax_nn:
            how = "compared as zeros"
        elif not self.as_zero:
            how = f"compared as {JAX_NN_VALUE}"
        else:
            how = f"(row, head) pairs compared as zeros: {self.as_zero}, as {JAX_NN_VALUE}: {self.as_jax_nn}"
        return f"{self.rows} row{'s' if self.rows != 1 else ''} see{'s' if self.rows == 1 else ''} no key: {how}"


def empty_row_target(out, ref, empty) -> EmptyRows:
    """Apply the empty-row rule: out, ref (..., N, H) float64, empty (..., N) bool (True where the
    (row, head) sees no key); rows are the leading axes before N."""
    empty = np.broadcast_to(np.asarray(empty, bool), np.shape(ref)[:-1])
    if not empty.any():
        return EmptyRows(ref)
    out = np.asarray(out, np.float64)
    with np.errstate(invalid="ignore"):
        as_zero = empty & (np.linalg.norm(out, axis=-1) < np.linalg.norm(out - ref, axis=-1))
    target = np.where(as_zero[..., None], 0.0, ref)
    rows = int(empty.any(axis=-1).sum())
    return EmptyRows(target, rows, int(as_zero.sum()), int((empty & ~as_zero).sum()))


def errors_past_empty_rows(out, ref, empty) -> tuple[float, float, EmptyRows]:
    """(rel L2, worst row's error, how the rows that see no key were compared) of ``out`` against ``ref`` after
    the empty-row rule (``empty_row_target``; shapes as there)."""
    e = empty_row_target(out, ref, empty)
    return rel_l2(out, e.target), row_rel_err(out, e.target), e


def empty_lse_bound(dtype) -> float:
    """An empty row's lse passes at or below this (its dtype's masked-logit value x ``EMPTY_LSE_FRACTION``)."""
    return EMPTY_LSE_FRACTION * large_negative_value(dtype)


def lse_error(lse, ref_lse) -> float:
    """The worst (row, head)'s |lse - ref| / (1 + |ref|) where the reference is finite; inf when ``lse`` has
    NaN or +-Inf there, or a row whose reference is -inf (sees no key) has an lse above ``empty_lse_bound``."""
    dtype = np.dtype(lse.dtype)
    lse, ref = np.asarray(lse).astype(np.float64), np.asarray(ref_lse, np.float64)
    live = np.isfinite(ref)
    dead = lse[~live]
    if np.any(np.isnan(dead)) or np.any(dead > empty_lse_bound(dtype)):
        return math.inf
    got, want = lse[live], ref[live]
    if not np.all(np.isfinite(got)):
        return math.inf
    return float(np.max(np.abs(got - want) / (1.0 + np.abs(want)))) if got.size else 0.0


def lse_floor(dtype) -> float:
    """The lse limit's floor: the dtype's policy floor, and never below one unit of its last place."""
    return max(FLOORS[np.dtype(dtype).name], float(ml_dtypes.finfo(np.dtype(dtype)).eps))
