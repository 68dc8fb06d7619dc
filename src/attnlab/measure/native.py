"""A cell of a backend that is not a JAX op (``backends.base.NativeBackend``, e.g. PyTorch SDPA), once
``inputs.cell_inputs`` has asked the backend whether it runs it (a decode cell: its decode semantics, scales,
lengths and sinks): its run (``NativeRun``), checked whole by ``measure.cell`` (``NativeRun.output``), then timed
(``NativeRun.time``), both on the one kernel the backend builds for the cell (``NativeRun.kernel``).

The backend hands over its kernel (``native_fn``: the callable, a synchronize function, its input
sets and optional hooks); the loop lives here, below no backend (``time_kernel``): CUPTI kernel ms as for
every JAX backend (``timers.cupti_per_call``), device events only where CUPTI cannot be used (the record's
``timer`` then says ``cuda_events`` and ``timer_note`` why), wall ms, pipelined ms, first-call s,
and the cell's own peak of the library's allocations where the backend can read it.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time

import jax

from . import memory
from .outcome import Skip, classify
from .stats import Stats
from .timers import cupti_per_call


@dataclasses.dataclass(frozen=True)
class NativeRun:
    """A native cell the backend accepted (``inputs.cell_inputs`` asked it): its call (``ins.call``), the logits
    ``scale`` and, for a decode cell, ``decode`` = (kv_lengths, causal)."""

    backend: object
    cell: object
    ins: object
    grads = None      # a native cell is forward only: no gradients, no cotangent
    ct = None
    caches = None     # nor a quantized cache (no native backend ``takes_kv_scales``)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.cell.head_dim)

    @property
    def decode(self) -> tuple | None:
        return None if self.cell.lengths is None else (self.cell.kv_lengths(), self.cell.causal)

    @functools.cached_property
    def kernel(self):
        """The backend's kernel on the cell's input sets (``native_fn``, a ``NativeCall``), built once: the output
        that is checked and the calls that are timed are its."""
        return self.backend.native_fn(self.ins.call, self.scale, self.ins.sets, decode=self.decode)

    def output(self):
        """The kernel's output on the first input set, as a JAX array: the backend's ``to_jax`` hook where it has
        one (PyTorch's output is a strided view, made contiguous first), else handed over by DLPack."""
        fn, sync, sets, extras = self.kernel
        out = fn(*sets[0])
        sync()
        return extras.get("to_jax", jax.dlpack.from_dlpack)(out)

    def time(self, opts, rec: dict, info, phases) -> None:
        """Time the kernel (``time_kernel``; CUPTI where it works, said in ``timer``) into ``rec``; raises
        ``Skip``."""
        try:
            rec["repeats"] = repeats = opts.repeats or 20
            with phases("timing"):
                rec.update(time_kernel(self.kernel, _library(self.backend), repeats, opts.warmup))
            rec["process_peak_bytes"] = memory.process_peak_bytes()
        except Skip:
            raise
        except Exception as e:  # noqa: BLE001
            raise Skip(*classify(e, "run"))


def _library(backend) -> str:
    return backend.library[0] if backend.library else backend.name


def time_kernel(kernel, lib: str, repeats: int, warmup: int) -> dict:
    """Time a native backend's ``kernel`` (``NativeCall``) of the library ``lib``; returns the record's timing
    fields."""
    fn, sync, sets, extras = kernel
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
