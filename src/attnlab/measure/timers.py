"""Timers for a jitted function: GPU kernel time (CUPTI), wall time, pipelined wall time, compile time.

Kernel time sums every kernel one call launches, measured by CUPTI through
``jax.experimental.mosaic.gpu.profiler.measure`` (one CUPTI subscriber at a time). It exists
only on NVIDIA GPUs; elsewhere ``kernel_timer_available()`` is False and callers use wall time,
labelled as such. Inputs rotate among several sets so a small problem is not served from L2.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import jax

from .stats import Stats


def kernel_timer_available() -> str | None:
    """None when CUPTI kernel timing works here, else the reason it does not."""
    if jax.default_backend() != "gpu":
        return f"no CUPTI kernel timer on {jax.default_backend()}: wall clock used instead"
    try:
        from jax.experimental.mosaic.gpu import profiler  # heavy: Mosaic GPU, GPU timer only  # noqa: F401
    except Exception as e:  # pragma: no cover - GPU only
        return f"jax.experimental.mosaic.gpu.profiler unavailable ({type(e).__name__}: {e})"
    return None


def _block(x):
    return jax.block_until_ready(x)


def compile_seconds(fn: Callable, args: Sequence) -> tuple[Callable, float, float]:
    """(compiled, lower_s, compile_s): jax.jit(fn) lowered and compiled for ``args``, timed apart."""
    t0 = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return compiled, t1 - t0, t2 - t1


def wall_per_call(compiled: Callable, arg_sets: Sequence[Sequence], repeats: int, min_time_s: float = 0.0,
                  max_calls: int = 10_000) -> Stats:
    """Host clock around each blocked call: the codelab's method (includes dispatch).

    At least ``repeats`` calls, and more until ``min_time_s`` seconds have passed (at most
    ``max_calls``): a host clock is disturbed by whatever else the machine runs, and samples spread
    over a tenth of a second see that disturbance (in their spread) where five back-to-back calls
    of a tenth of a millisecond do not."""
    samples = []
    t_end = time.perf_counter() + max(0.0, min_time_s)
    i = 0
    while i < repeats or (time.perf_counter() < t_end and i < max_calls):
        args = arg_sets[i % len(arg_sets)]
        t0 = time.perf_counter()
        _block(compiled(*args))
        samples.append((time.perf_counter() - t0) * 1e3)
        i += 1
    return Stats.of(samples)


def pipelined_calls(wall_ms: float | None, calls: int, seconds: float) -> int:
    """``calls``, fewer (at least 2) where 3 rounds of ``calls`` calls of ``wall_ms`` would pass ``seconds``:
    a slow cell (a CPU, a long sequence) has no dispatch gap left to hide, so 60 calls tell no more than 6."""
    if not wall_ms or wall_ms <= 0:
        return calls
    return max(2, min(calls, math.ceil(seconds * 1e3 / (3 * wall_ms))))


def wall_pipelined(compiled: Callable, arg_sets: Sequence[Sequence], calls: int, rounds: int = 3) -> Stats:
    """Many calls queued back to back, one block at the end; ms per call, ``rounds`` samples."""
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = None
        for i in range(calls):
            out = compiled(*arg_sets[i % len(arg_sets)])
        _block(out)
        samples.append((time.perf_counter() - t0) * 1e3 / calls)
    return Stats.of(samples)


def kernel_per_call(compiled: Callable, arg_sets: Sequence[Sequence], repeats: int) -> Stats:
    """GPU kernel milliseconds per call (all kernels of one call summed), via CUPTI."""
    from jax.experimental.mosaic.gpu import profiler  # heavy: Mosaic GPU, GPU timer only

    per_set = max(1, -(-repeats // len(arg_sets)))  # ceil: at least ``repeats`` samples in all
    samples: list[float] = []
    measured = profiler.measure(compiled, iterations=per_set)
    for args in arg_sets:
        _, t = measured(*args)
        if t is None:
            raise RuntimeError("CUPTI saw no kernel launched by this function")
        samples.extend(t if isinstance(t, (list, tuple)) else [t])
    return Stats.of(samples)


def cupti_per_call(fn: Callable, arg_sets: Sequence[Sequence], repeats: int, sync: Callable[[], None]) -> Stats:
    """GPU kernel milliseconds per call of a callable that is not a JAX function (PyTorch), by CUPTI.

    The same CUPTI extension as ``kernel_per_call`` (jaxlib's Mosaic GPU library), driven directly:
    ``profiler.measure`` jit-compiles what it measures, which a PyTorch call cannot be. All kernels
    one call launches are summed; ``sync()`` waits for the device (``torch.cuda.synchronize``)."""
    from jax._src.lib import mosaic_gpu as mosaic_gpu_lib  # JAX-private: may move

    if mosaic_gpu_lib is None:
        raise RuntimeError("jaxlib has no Mosaic GPU library: no CUPTI timer")
    ext = mosaic_gpu_lib._mosaic_gpu_ext
    per_set = max(1, -(-repeats // len(arg_sets)))
    samples: list[float] = []
    for args in arg_sets:
        fn(*args)
        sync()
        ext._cupti_init()
        try:
            for _ in range(per_set):
                fn(*args)
            sync()
        finally:
            try:
                timings = ext._cupti_get_timings(True)
            except TypeError:  # older jaxlib: no ``finalize`` argument
                timings = ext._cupti_get_timings()
        if not timings:
            raise RuntimeError("CUPTI saw no kernel launched by this call")
        if len(timings) % per_set:
            raise RuntimeError(f"{len(timings)} kernels over {per_set} calls: calls launch different kernels")
        k = len(timings) // per_set
        samples.extend(sum(t for _, t in timings[i * k:(i + 1) * k]) for i in range(per_set))
    return Stats.of(samples)


def warm_up(compiled: Callable, arg_sets: Sequence[Sequence], n: int = 2):
    for i in range(max(n, len(arg_sets))):
        _block(compiled(*arg_sets[i % len(arg_sets)]))


def time_into(rec: dict, compiled: Callable, arg_sets: Sequence, opts, cupti: bool) -> None:
    """Warm ``compiled`` up on ``arg_sets``, then put its times in ``rec``: ``kernel_*`` (CUPTI, when
    ``cupti``), ``wall_*`` (for at least ``opts.min_time_s`` without CUPTI) and ``pipelined_*``; ``rec["repeats"]``
    says how many calls each median is of."""
    warm_up(compiled, arg_sets, opts.warmup)
    if cupti:
        rec.update(kernel_per_call(compiled, arg_sets, rec["repeats"]).as_dict("kernel"))
    rec.update(wall_per_call(compiled, arg_sets, rec["repeats"],
                             min_time_s=0.0 if cupti else opts.min_time_s).as_dict("wall"))
    rec["pipelined_calls"] = pipelined_calls(rec["wall_ms"], opts.pipelined_calls, opts.pipelined_s)
    rec["pipelined_ms"] = wall_pipelined(compiled, arg_sets, rec["pipelined_calls"]).median
