"""A cell's outcome: how failures are classified, the rates of a timed cell, and the one place its record is built.

``Skip(status, reason, fields)`` ends a cell early with a ``Status`` (and the fields measured before it
stopped, e.g. the check's errors of an incorrect cell); ``judged`` turns a check's verdict (the tolerance
policy's, ``reference.tolerance.policy_verdict``) into its record fields, or a ``Skip('incorrect')`` carrying
them: every check against float64 of sampled rows (a serving step's, a quantized cache's); ``classify`` maps
an exception raised while compiling or running to (status, reason); ``rates`` turns the headline time into
TFLOP/s, GB/s and percentages of peak; ``finish`` clears the timing fields of a cell that was not timed, stamps
the fields and builds the typed record (``attnlab.core.record_model.CellRecord``: its validator holds the
status rules, so a cell whose fields break one raises ``RecordError`` here, an error of attnlab).
"""
from __future__ import annotations

import time

from ..core.datasheet import rates_of
from ..core.errors import UnsupportedError
from ..reference.float64 import default_matmul_is_tf32
from ..reference.tolerance import errors_text
from ..core.record_model import CellRecord, fields_where
from ..core.records import STATUSES, Status, time_ms  # noqa: F401  (STATUSES re-exported)
from . import peaks

#: Fields every cell record has (None until measured) and those cleared when a cell was not timed,
#: derived from the typed record's metadata (``attnlab.core.record_model``: ``measured`` and ``cleared``).
MEASURED_FIELDS = fields_where("measured")
TIMING_FIELDS = fields_where("cleared")


class Skip(Exception):
    """Stop measuring a cell: its record gets ``status`` (a ``Status``), ``reason`` and ``fields``."""

    def __init__(self, status: Status | str, reason: str, fields: dict | None = None):
        super().__init__(reason)
        self.status, self.reason, self.fields = Status(status), reason, fields or {}


def judged(fields: dict, name: str, verdict: dict, tolerance: str, where: str = "") -> dict:
    """The record fields of a check against float64 with one verdict (``policy_verdict``'s dict, or one with
    ok, rel_err, limit and margin): ``fields`` + rel_err, rel_err_f64, margin, tolerance and checks {name:
    verdict}. ``Skip('incorrect')`` carrying them when it fails, naming the errors, their limits and ``where``."""
    fields = {**fields, "rel_err": verdict["rel_err"], "rel_err_f64": verdict["rel_err"],
              "margin": verdict["margin"], "tolerance": tolerance, "checks": {name: verdict}}
    if not verdict["ok"]:
        raise Skip(Status.INCORRECT, f"output wrong{where}: {errors_text(verdict)} ({tolerance})", fields)
    return fields


def classify(exc: BaseException, phase: str) -> tuple[Status, str]:
    """Map an exception raised while compiling ('compile') or running ('run') to (status, reason)."""
    msg = f"{type(exc).__name__}: {exc}"
    low = msg.lower()
    if isinstance(exc, MemoryError) or "resource_exhausted" in low or "out of memory" in low or "oom" in low.split():
        return Status.OOM, _short(msg)
    if isinstance(exc, (UnsupportedError, NotImplementedError)):
        return Status.UNSUPPORTED, _short(msg)
    return (Status.COMPILE_ERROR if phase == "compile" else Status.RUNTIME_ERROR), _short(msg)


def _short(msg: str, n: int = 500) -> str:
    """One line; long messages keep their head and their tail (where the cause usually is)."""
    msg = " ".join(msg.split())
    return msg if len(msg) <= n else msg[: n // 2] + " ... " + msg[-(n // 2):]


def rates(times: dict, cell, info, backend=None) -> dict:
    """TFLOP/s, GB/s and % of peak fields from ``times`` (a timed cell's fields: ``kernel_ms``/``wall_ms``,
    ``flops``, ``bytes``; the headline time is kernel time where measured).

    The peak is the one of the dtype the backend computes in (``Backend.compute_dtype``, e.g. FP8); a sharded
    cell's percentages and roofline are of its ``devices`` together (``peak_tflops`` stays one device's)."""
    t_ms, out, n = time_ms(times), {}, getattr(cell, "devices", None) or 1
    if times.get("kernel_ms") is not None and times.get("wall_ms") is not None:
        out["dispatch_ms"] = times["wall_ms"] - times["kernel_ms"]
    peak_dtype = (backend.compute_dtype if backend is not None else None) or cell.dtype
    pk = peaks.peak_tflops(info.kind, peak_dtype, tf32=default_matmul_is_tf32())
    out["peak_dtype"] = peaks.dtype_class(peak_dtype, default_matmul_is_tf32())
    out["peak_tflops"] = pk
    out["pct_peak"] = None
    out.update(rates_of(times["flops"], times["bytes"], t_ms, pk, peaks.peak_for_kind(info.kind), n))
    ceil = peaks.load_ceilings(info.kind)
    if ceil and cell.dtype in ("bfloat16", "float16"):
        out["pct_ceiling"] = 100 * out["tflops"] / (ceil["matmul_tflops"] * n)
    return out


def finish(fields: dict, status: Status, reason: str | None, t_start: float) -> CellRecord:
    """The cell's record from the fields measured: not timed (any status but ok / unchecked), its timing
    fields are cleared; ``cell_s`` and ``timestamp`` stamped. Raises ``RecordError`` for a record that
    breaks the schema (a bug of attnlab: e.g. a rate above the device's peak)."""
    if not status.timed:
        cleared = [*TIMING_FIELDS, *(k for k in fields if k.startswith(("kernel_", "wall_")))]
        fields = {**fields, **dict.fromkeys(cleared)}
    return CellRecord.from_flat({**fields, "status": status, "reason": reason, "cell_s": time.perf_counter() - t_start,
                                 "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
