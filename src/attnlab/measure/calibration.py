"""What this machine measured, for the estimate (``attnlab.measure.estimate``): seconds per compile.

A cell's cost on a small problem is its compiles, not its arithmetic: the kernel's compile, and the
check's reference programs (compiled once per problem, shared by every backend of that problem:
``attnlab.reference.compiled``). Both depend on the machine (and its load), so they are measured,
not assumed: ``learn(rec, info)`` takes them from the first cell of a sweep that compiled and
checked (a forward-only equivalent: a cell with gradients compiles about ``GRAD_FACTOR`` times as
much), keeps them for the rest of the process and stores them beside the ceilings
(``ATTNLAB_CACHE_DIR``, default ``~/.cache/attnlab``, file ``estimate.json``, by device kind), so the
next sweep's estimate on this machine starts from them. Where nothing was measured yet,
``DEFAULTS`` (seconds a forward cell's compiles took on a 2-core CPU and on an H200).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

#: A cell with gradients (fwd+bwd, bwd) compiles forward and backward programs: about twice a forward's.
GRAD_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class Calibration:
    compile_s: float       # the kernel's compile (lower + compile) of a forward cell, seconds
    reference_s: float     # the check's reference programs of a forward problem, compiled once, seconds
    source: str            # "defaults" or where the numbers were measured


DEFAULTS = {"cpu": Calibration(0.6, 1.0, "defaults"), "gpu": Calibration(2.0, 1.0, "defaults")}
_LEARNT: dict[str, Calibration] = {}     # by device kind: what this process uses
_MEASURED: set[str] = set()                # device kinds this process measured itself


def path() -> str:
    from .peaks import cache_path

    return os.path.join(os.path.dirname(cache_path()), "estimate.json")


def _key(info) -> str:
    return info.kind or info.platform


def current(info) -> Calibration:
    """This process's calibration for the device ``info``: learnt in this process, else stored by an
    earlier sweep on this machine, else ``DEFAULTS``."""
    key = _key(info)
    if key in _LEARNT:
        return _LEARNT[key]
    try:
        with open(path(), encoding="utf-8") as f:
            d = json.load(f)[key]
        cal = Calibration(float(d["compile_s"]), float(d["reference_s"]), d.get("source") or "stored")
    except (OSError, ValueError, KeyError, TypeError):
        cal = DEFAULTS.get(info.platform, DEFAULTS["gpu"])
    _LEARNT[key] = cal
    return cal


def learn(rec: dict, info, *, check_compute_s: float = 0.0) -> Calibration | None:
    """Calibrate from a measured cell record (``compile_s`` and ``check_s`` both measured; the check's
    arithmetic, ``check_compute_s``, taken out) unless this process already learnt from one; stores it.
    Returns the new calibration, or None where ``rec`` teaches nothing."""
    key = _key(info)
    if key in _MEASURED:
        return None
    comp, chk = rec.get("compile_s"), rec.get("check_s")
    if rec.get("status") not in ("ok", "incorrect") or not comp or not chk:
        return None
    factor = GRAD_FACTOR if rec.get("mode", "fwd") != "fwd" else 1.0
    cal = Calibration(comp / factor, max(0.0, chk - check_compute_s) / factor,
                      f"measured here {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC")
    _LEARNT[key] = cal
    _MEASURED.add(key)
    _store(key, cal)
    return cal


def _store(key: str, cal: Calibration) -> None:
    p = path()
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        try:
            with open(p, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = {}
        data[key] = dataclasses.asdict(cal)
        tmp = p + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, p)
    except OSError:
        pass   # a read-only cache: the calibration still holds for this process


def forget() -> None:
    """Drop what this process learnt (tests; a new sweep calibrates again from its first cell)."""
    _LEARNT.clear()
    _MEASURED.clear()
