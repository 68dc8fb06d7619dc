"""Timing a backend that is not a JAX op (``backends.base.NativeBackend``, e.g. PyTorch SDPA).

The backend hands over its kernel (``native_fn``: the callable, a synchronize function, its input
sets and optional hooks); the loop lives here, below no backend: CUPTI kernel ms as for every JAX
backend (``timers.cupti_per_call``), device events only where CUPTI cannot be used (the record's
``timer`` then says ``cuda_events`` and ``timer_note`` why), wall ms, pipelined ms, first-call s,
and the cell's own peak of the library's allocations where the backend can read it.
"""
from __future__ import annotations

import time

from .stats import Stats
from .timers import cupti_per_call


def measure_native(backend, spec, scale: float, arg_sets, repeats: int, warmup: int, decode: tuple | None = None) -> dict:
    """Time ``backend.native_fn(spec, scale, arg_sets, decode=decode)``; returns the record's timing fields."""
    lib = backend.library[0] if backend.library else backend.name
    fn, sync, sets, extras = backend.native_fn(spec, scale, arg_sets, decode=decode)
    sync()
    if extras.get("reset_peak"):
        extras["reset_peak"]()
    t0 = time.perf_counter()
    fn(*sets[0])
    sync()
    first_s = time.perf_counter() - t0
    for i in range(max(warmup, len(sets))):
        fn(*sets[i % len(sets)])
    sync()
    out: dict = {"compile_s": first_s, "lower_s": 0.0}
    try:
        out.update(cupti_per_call(fn, sets, repeats, sync).as_dict("kernel"), timer="cupti")
    except Exception as e:  # noqa: BLE001 - device events instead, and the record says why
        event_ms = extras.get("event_ms")
        if event_ms is None:
            raise
        samples = [event_ms(lambda s=sets[i % len(sets)]: fn(*s)) for i in range(repeats)]
        out.update(Stats.of(samples).as_dict("kernel"), timer="cuda_events",
                   timer_note=f"CUPTI unusable for {lib} ({type(e).__name__}: {e}): CUDA events")
    wall = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(*sets[i % len(sets)])
        sync()
        wall.append((time.perf_counter() - t0) * 1e3)
    out.update(Stats.of(wall).as_dict("wall"))
    t0 = time.perf_counter()
    for i in range(20):
        fn(*sets[i % len(sets)])
    sync()
    out["pipelined_ms"] = (time.perf_counter() - t0) * 1e3 / 20
    if extras.get("peak_bytes"):
        out["runtime_peak_bytes"] = int(extras["peak_bytes"]())
        if extras.get("peak_scope"):
            out["runtime_peak_scope"] = extras["peak_scope"]
    return out
