"""No record faster than the hardware: a timed record whose rate is above its device's datasheet peak.

A timed cell record (``ok`` or ``unchecked``) states a rate twice over: ``flops`` and ``bytes`` of the
call (``attnlab.core.workload``) over its headline time (``records.time_ms``: kernel time where
measured). No device runs faster than its datasheet (``attnlab.core.datasheet``), so a record above it
means attnlab counted work the call does not do or timed the wrong thing: ``check_rates`` raises
``RateAbovePeakError`` (a ``RecordError``), an error of attnlab, never a result. The bounds:

- FLOP/s <= the device's dense peak for the fastest arithmetic the record's dtype may run in (bfloat16
  and float16: bf16; float8: fp8; float32: tf32, since libraries may run float32 matmuls in TF32;
  float64: the fp32 entry, which no FP64 rate exceeds) or for ``peak_dtype`` (what the backend computes
  in, e.g. fp8), the larger; times ``devices`` for a sharded cell;
- bytes/s <= the device's HBM bandwidth x ``devices``, where the inputs it rotated through
  (``input_sets`` x ``bytes``) exceed the L2 cache (smaller inputs may be served from L2 legitimately).

"By more than the timer's noise": the bound is raised by ``timer_noise(rec)``, the spread of the record's
own timing samples, (max - min) / median of the headline clock, at least ``NOISE_FLOOR`` (2%: the
datasheet's rounding and the clock's resolution). The device is ``env.device_kind`` (the sweep stamps
it) or the mesh's kind; a record without either is bounded by its own ``peak_tflops`` (FLOP/s only);
a device without a datasheet (a CPU) is not bounded.
"""
from __future__ import annotations

from .datasheet import dtype_class, peak_for_kind
from .errors import RecordError
from .record_time import time_ms, timing

#: The least relative noise granted to any timer (see the module docstring).
NOISE_FLOOR = 0.02


class RateAbovePeakError(RecordError):
    """A record whose rate is above the device's datasheet peak: a bug in attnlab's counts or timers."""


def timer_noise(rec: dict) -> tuple[float, str]:
    """(relative noise, what it is made of) of a timed record's headline clock."""
    t = timing(rec)
    spread = (t["max"] - t["min"]) / t["median"] if t and t["median"] > 0 else 0.0
    n = rec.get(f"{t['clock']}_n") if t else None
    what = f"(max - min) / median of {n or 'its'} {t['clock'] if t else ''} samples".replace("  ", " ")
    return (spread, what) if spread > NOISE_FLOOR else (NOISE_FLOOR, f"the {NOISE_FLOOR:.0%} floor")


def device_kind(rec: dict) -> str | None:
    """The record's device kind: ``env.device_kind``, else its mesh's first kind, else None."""
    env, mesh = rec.get("env"), rec.get("mesh")
    kind = env.get("device_kind") if isinstance(env, dict) else None
    if not kind and isinstance(mesh, dict) and mesh.get("kinds"):
        kind = mesh["kinds"][0]
    return kind or None


def _classes(rec: dict) -> set:
    dtype = str(rec.get("dtype"))
    own = dtype_class(dtype, tf32=True)    # and the class it computed in (an FP8 cell's), but float64's is fp32's
    return {own} if dtype == "float64" else {own, rec.get("peak_dtype")} - {None}


def bounds(rec: dict) -> dict:
    """{"flops": (TFLOP/s bound, what it is), "bytes": (GB/s bound, what it is)} of a record, before the
    noise; a bound is None where there is none."""
    sheet = peak_for_kind(device_kind(rec) or "")
    devices = rec.get("devices") or 1
    per = f" x {devices} devices" if devices > 1 else ""
    if sheet is None:
        pk = rec.get("peak_tflops")
        return {"flops": (pk * devices if pk else None, f"the record's own peak_tflops{per}"), "bytes": (None, "")}
    cls = max(_classes(rec) & set(sheet.tflops), key=sheet.tflops.get, default=None)
    rotated = (rec.get("input_sets") or 1) * (rec.get("bytes") or 0) / devices    # each device's, past its own L2
    return {"flops": (sheet.tflops[cls] * devices if cls else None, f"the {sheet.source}, {cls}{per}"),
            "bytes": (sheet.hbm_tbps * 1e3 * devices if rotated > sheet.l2_bytes else None,
                      f"the {sheet.source}, HBM{per}")}


def check_rates(rec: dict, where: str = "") -> dict:
    """Raise ``RateAbovePeakError`` when a timed record's FLOP/s or bytes/s is above its device's
    datasheet peak by more than the timer's noise; return the record unchanged otherwise."""
    if rec.get("status") not in ("ok", "unchecked"):
        return rec
    ms = time_ms(rec)
    if not ms or ms <= 0:
        return rec
    limits = bounds(rec)
    noise, why = timer_noise(rec)
    for field, unit, wrong in (("flops", "TFLOP/s", "FLOPs the call does not compute"),
                               ("bytes", "GB/s", "bytes the call does not move")):
        amount, (bound, what) = rec.get(field), limits[field]
        if not amount or not bound:
            continue
        rate = amount / (ms * 1e-3) / (1e12 if unit == "TFLOP/s" else 1e9)
        if rate > bound * (1 + noise):
            raise RateAbovePeakError(
                field, f"{rate:.4g} {unit} ({field} / {ms:.4g} ms) is {100 * rate / bound:.0f}% of the peak of "
                       f"{bound:.4g} {unit} from {what}, above it by more than the timer's noise ({noise:.1%}: {why}). "
                       f"No device runs above its datasheet: attnlab counted {wrong}, "
                       f"or timed the wrong thing. This is a bug in attnlab (please report it with this "
                       f"record), not a result.", where)
    return rec
