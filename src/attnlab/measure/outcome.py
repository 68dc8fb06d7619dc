"""A cell's outcome: how failures are classified, the metrics of a timed cell, the finishing touches.

``Skip(status, reason)`` ends a cell early with a status of ``attnlab.core.records.STATUSES``;
``classify`` maps an exception raised while compiling or running to (status, reason);
``_metrics`` turns the headline time into TFLOP/s, GB/s and percentages of peak;
``_finish`` clears the timing fields of a cell that was not timed and stamps the record.
"""
from __future__ import annotations

import time

from ..core.errors import UnsupportedError
from ..reference.float64 import default_matmul_is_tf32
from ..core.record_model import fields_where
from ..core.records import STATUSES, time_ms  # noqa: F401  (STATUSES re-exported)
from . import peaks

#: Fields every cell record has (None until measured) and those cleared when a cell was not timed,
#: derived from the typed record's metadata (``attnlab.core.record_model``: ``measured`` and ``cleared``).
MEASURED_FIELDS = fields_where("measured")
TIMING_FIELDS = fields_where("cleared")


class Skip(Exception):
    """Stop measuring a cell: its record gets ``status`` and ``reason``."""

    def __init__(self, status, reason):
        super().__init__(reason)
        self.status, self.reason = status, reason


def classify(exc: BaseException, phase: str) -> tuple[str, str]:
    """Map an exception raised while compiling ('compile') or running ('run') to (status, reason)."""
    msg = f"{type(exc).__name__}: {exc}"
    low = msg.lower()
    if isinstance(exc, MemoryError) or "resource_exhausted" in low or "out of memory" in low or "oom" in low.split():
        return "oom", _short(msg)
    if isinstance(exc, (UnsupportedError, NotImplementedError)):
        return "unsupported", _short(msg)
    return ("compile_error" if phase == "compile" else "runtime_error"), _short(msg)


def _short(msg: str, n: int = 500) -> str:
    """One line; long messages keep their head and their tail (where the cause usually is)."""
    msg = " ".join(msg.split())
    return msg if len(msg) <= n else msg[: n // 2] + " ... " + msg[-(n // 2):]


def _metrics(rec: dict, cell, info, backend=None) -> None:
    """TFLOP/s, GB/s and % of peak from the record's headline time (kernel time where measured).

    The peak is the one of the dtype the backend computes in (``Backend.compute_dtype``, e.g. FP8)."""
    t_ms = time_ms(rec)
    if rec["kernel_ms"] is not None and rec["wall_ms"] is not None:
        rec["dispatch_ms"] = rec["wall_ms"] - rec["kernel_ms"]
    rec["tflops"] = rec["flops"] / (t_ms * 1e-3) / 1e12
    rec["gbps"] = rec["bytes"] / (t_ms * 1e-3) / 1e9
    peak_dtype = (backend.compute_dtype if backend is not None else None) or cell.dtype
    pk = peaks.peak_tflops(info.kind, peak_dtype, tf32=default_matmul_is_tf32())
    rec["peak_dtype"] = peaks.dtype_class(peak_dtype, default_matmul_is_tf32())
    rec["peak_tflops"] = pk
    rec["pct_peak"] = 100 * rec["tflops"] / pk if pk else None
    sheet = peaks.peak_for_kind(info.kind)
    if sheet and pk:
        # the roofline bound of this cell: max(bytes / HBM bandwidth, FLOPs / compute peak)
        rec["pct_bandwidth"] = 100 * rec["gbps"] / (sheet.hbm_tbps * 1e3)
        rec["roofline_ms"] = max(rec["bytes"] / (sheet.hbm_tbps * 1e12), rec["flops"] / (pk * 1e12)) * 1e3
        rec["pct_roofline"] = 100 * rec["roofline_ms"] / t_ms
    ceil = peaks.load_ceilings(info.kind)
    if ceil and cell.dtype in ("bfloat16", "float16"):
        rec["pct_ceiling"] = 100 * rec["tflops"] / ceil["matmul_tflops"]


def _finish(rec: dict, t_start: float) -> dict:
    if rec["status"] not in ("ok", "unchecked"):
        for k_ in TIMING_FIELDS:
            rec[k_] = None
        for k_ in [k for k in rec if k.startswith(("kernel_", "wall_"))]:
            rec[k_] = None
    rec["cell_s"] = time.perf_counter() - t_start
    rec["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return rec
