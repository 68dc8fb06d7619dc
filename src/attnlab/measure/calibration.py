"""What this machine measured, for the estimate (``attnlab.measure.estimate``): seconds per compile.

A cell's cost on a small problem is its compiles, not its arithmetic: the kernel's compile, and what
is compiled once per problem and shared by every backend of it (the check's reference programs,
``attnlab.reference.compiled``, and the programs that draw the inputs). Both depend on the machine
and on its load now, so they are measured, not assumed:

- ``learn(rec, info)`` takes them from the first cell of a sweep that compiled and checked (as a
  forward cell: one with gradients compiles about ``GRAD_FACTOR`` times as much), keeps them for the
  rest of the process and stores them beside the ceilings (``ATTNLAB_CACHE_DIR``, default
  ``~/.cache/attnlab``, file ``estimate.json``, by device kind) for the next sweep here;
- ``probe_s()`` times the compile of one small attention program now (wall seconds, at least its
  CPU time times the last minute's contention; once a process): the stored seconds are scaled by
  the probe now over the probe when they were measured, so a machine busier (or idler) than then is
  estimated so. The probe is taken once a process, before a sweep starts its background compiles
  (``attnlab.sweep.engine``): taken beside them, its process CPU time counts theirs too;
- the check's arithmetic: ``float64_gflops()`` times the NumPy float64 reference (the check's
  sampled rows, ``attnlab.reference.float64``) on a small problem now (once a process), so a fast
  host is not estimated as the slowest CPU; and ``learn`` keeps ``check_x``, the first cell's
  measured check over its estimated arithmetic where it was faster (within ``CHECK_BOUNDS``), with
  the rate that estimate used, for the estimates after it (a noisy rate measured again would not
  match the factor).

Where nothing was measured yet, ``DEFAULTS``: on a CPU the seconds a forward cell's compiles took
on a lightly loaded 2-core CPU (with its probe's seconds); on a GPU a guess, not scaled (the first
sweep there calibrates it; on the H200 the first cell of a small bf16 bench compiled in 1.2 s).
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..reference.float64 import reference_attention
from .peaks import cache_path

#: A cell with gradients (fwd+bwd, bwd) compiles forward and backward programs: about twice a forward's.
GRAD_FACTOR = 2.0
#: The probe's ratio now / then is kept within these bounds (a probe is one small compile: noisy).
SCALE_BOUNDS = (0.5, 20.0)
#: A measured check over its estimated arithmetic is kept within these (a check slower than estimated
#: is taken as compiling, ``problem_s``: the factor is at most 1).
CHECK_BOUNDS = (0.05, 1.0)
#: ``float64_gflops`` is kept within these GFLOP/s (one small timing: noisy).
FLOAT64_GFLOPS_BOUNDS = (0.25, 50.0)


@dataclasses.dataclass(frozen=True)
class Calibration:
    compile_s: float       # the kernel's compile (lower + compile) of a forward cell, seconds
    problem_s: float       # compiled once per forward problem: the inputs' and the check's programs, seconds
    source: str            # "defaults" or when they were measured here
    probe_s: float | None = None   # ``probe_s()`` when they were measured (None: not scaled by the probe)
    check_x: float = 1.0   # the first cell's measured check over its estimated arithmetic (<= 1; 1: as estimated)
    float64_gflops: float | None = None   # ``float64_gflops()`` that estimate used (None: measured now)


DEFAULTS = {"cpu": Calibration(0.6, 1.2, "defaults", 0.065), "gpu": Calibration(1.5, 1.0, "defaults")}
_LEARNT: dict[str, Calibration] = {}     # by device kind: what this process uses
_MEASURED: set[str] = set()                # device kinds this process measured itself
_PROBE: list[float] = []
_FLOAT64: list[float] = []


def path() -> str:
    return os.path.join(os.path.dirname(cache_path()), "estimate.json")


def _key(info) -> str:
    return info.kind or info.platform


def probe_s() -> float:
    """How slow this machine compiles now, in seconds: the wall time to compile one small attention
    program (64 x 32 float32), the median of three after one untimed (the first compile of a process
    pays for more than itself); at least its CPU time times the contention of the last minute,
    ``load_factor()`` (a probe of a few milliseconds can fall in a quiet moment of a busy machine).
    Once a process."""
    if not _PROBE:
        s = jax.ShapeDtypeStruct((64, 32), jnp.float32)
        walls, cpus = [], []
        for i in range(4):
            c = float(time.time_ns() % 1_000_003 + i)    # a new constant: a new program, never a cache hit
            f = jax.jit(lambda q, k: jax.nn.softmax((q @ k.T) * c, axis=-1) @ k)
            t0, c0 = time.perf_counter(), time.process_time()
            f.lower(s, s).compile()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        _PROBE.append(max(statistics.median(walls[1:]), statistics.median(cpus[1:]) * load_factor()))
    return _PROBE[0]


def float64_gflops() -> float:
    """GFLOP/s of the check's NumPy float64 reference here now: 4 T S N H over the wall seconds of
    ``reference_attention`` on 128 query rows, 1024 keys, 8 heads of 128 (0.54 GFLOP), the best of
    up to three after one untimed (no more once 0.5 s went: a slow machine is slow enough to see; a
    shared one stalls the odd call), within ``FLOAT64_GFLOPS_BOUNDS``. Once a process."""
    if not _FLOAT64:
        T, S, N, H = 128, 1024, 8, 128
        rng = np.random.default_rng(0)
        q, k = rng.standard_normal((1, T, N, H), np.float32), rng.standard_normal((1, S, N, H), np.float32)
        walls, t_end = [], time.perf_counter() + 0.5
        while len(walls) < 4 and (len(walls) < 2 or time.perf_counter() < t_end):
            t0 = time.perf_counter()
            reference_attention(q, k, k)
            walls.append(time.perf_counter() - t0)
        lo, hi = FLOAT64_GFLOPS_BOUNDS
        _FLOAT64.append(min(hi, max(lo, 4.0 * T * S * N * H / max(min(walls[1:]), 1e-9) / 1e9)))
    return _FLOAT64[0]


def load_factor() -> float:
    """How much slower than idle the last minute's load makes a compile: (load average / CPUs) ** 0.75,
    at least 1 (measured on a 2-core CPU: load 10 made the probe 3.3x slower than its CPU time)."""
    try:
        return max(1.0, (os.getloadavg()[0] / (os.cpu_count() or 1)) ** 0.75)
    except (OSError, AttributeError):
        return 1.0


def _valid(d) -> bool:
    """A stored calibration: an object whose compile_s and problem_s (and probe_s, check_x, float64_gflops where
    given) are finite numbers >= 0."""
    num = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < math.inf  # noqa: E731
    return (isinstance(d, dict) and num(d.get("compile_s")) and num(d.get("problem_s"))
            and all(d.get(k) is None or num(d[k]) for k in ("probe_s", "check_x", "float64_gflops")))


def _read() -> dict:
    """The stored calibrations by device kind, only the valid ones (``_valid``): none where the file is absent,
    unreadable or not a JSON object (a corrupt file reads as no file, and ``_store`` writes it anew)."""
    try:
        with open(path(), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if _valid(v)} if isinstance(data, dict) else {}


def stored(info) -> Calibration:
    """The calibration this process holds for the device ``info``: learnt in this process, else stored
    by an earlier sweep on this machine, else ``DEFAULTS`` (as measured, not scaled: ``current``)."""
    key = _key(info)
    if key not in _LEARNT:
        d = _read().get(key)
        _LEARNT[key] = DEFAULTS.get(info.platform, DEFAULTS["gpu"]) if d is None else Calibration(
            float(d["compile_s"]), float(d["problem_s"]), str(d.get("source") or "stored"),
            float(d["probe_s"]) if d.get("probe_s") else None,
            float(d.get("check_x") or 1.0),    # stored before check_x: 1
            float(d["float64_gflops"]) if d.get("float64_gflops") else None)
    return _LEARNT[key]


def current(info) -> Calibration:
    """``stored(info)`` scaled to this machine now: times the probe now over the probe then."""
    cal = stored(info)
    if not cal.probe_s:
        return cal
    lo, hi = SCALE_BOUNDS
    x = min(hi, max(lo, probe_s() / cal.probe_s))
    return dataclasses.replace(cal, compile_s=cal.compile_s * x, problem_s=cal.problem_s * x,
                               source=f"{cal.source}, x{x:.2g} for this machine's load now")


def learnt(info) -> bool:
    """Whether this process already calibrated the device ``info`` from a cell it measured."""
    return _key(info) in _MEASURED


def learn(rec: dict, info, *, check_compute_s: float = 0.0) -> Calibration | None:
    """Calibrate from a measured cell record (``compile_s``, ``check_s`` and ``inputs_s`` measured; the
    check's estimated arithmetic, ``check_compute_s`` seconds before any ``check_x``, taken out)
    unless this process already learnt from one; stores it. A check that made its references
    (``check_parts_s``) in less than ``check_compute_s`` sets ``check_x`` to measured / estimated
    (within ``CHECK_BOUNDS``) and leaves no compile in it. Returns the new calibration, or None where
    ``rec`` teaches nothing."""
    key = _key(info)
    comp, chk = rec.get("compile_s"), rec.get("check_s")
    if key in _MEASURED or rec.get("status") not in ("ok", "incorrect") or not comp or not chk:
        return None
    factor = GRAD_FACTOR if rec.get("mode", "fwd") != "fwd" else 1.0
    check_x = 1.0
    if rec.get("check_parts_s") and 0 < chk < check_compute_s:   # references cached: the check made none
        check_x = min(CHECK_BOUNDS[1], max(CHECK_BOUNDS[0], chk / check_compute_s))
    once = max(0.0, chk - check_compute_s * check_x) + (rec.get("inputs_s") or 0.0)
    cal = Calibration(comp / factor, once / factor, f"measured here {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} "
                                                   f"UTC", probe_s(), check_x, _FLOAT64[0] if _FLOAT64 else None)
    _LEARNT[key] = cal
    _MEASURED.add(key)
    _store(key, cal)
    return cal


def _store(key: str, cal: Calibration) -> None:
    """Add ``key``'s calibration to the file: read, change and replace under a lock (two sweeps may calibrate at
    once, a CPU's and a GPU's sharing the cache), through a temporary file of this writer's own."""
    p = path()
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = _read()     # what is not a valid calibration is dropped
            data[key] = dataclasses.asdict(cal)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(p), prefix="estimate.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2)
            os.replace(tmp, p)
    except OSError:
        pass   # a read-only cache: the calibration still holds for this process


def forget() -> None:
    """Drop what this process learnt and its probes (tests; a new sweep calibrates again)."""
    _LEARNT.clear()
    _MEASURED.clear()
    _PROBE.clear()
    _FLOAT64.clear()
