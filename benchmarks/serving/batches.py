"""The serving benchmarks' shared batch, check and timing helpers (``gpu.py``, ``grid_gpu.py``, ``variants.py``,
``fp8_window.py``, ``fused_merge.py``, ``decode/sinks_gpu.py``): the default batch's sizes and lengths, its caches,
one jitted function per static key, and CUPTI times (per call; per kernel of a call).

Batches (B=32, S_max=32768, H=128, bf16) draw their lengths from ``attnlab.core.request_lengths``; the checks
against float64 are ``checks.py``'s; the roofline peaks ``results_folder.roofline_peaks``. Imported after the
script that runs it has put ``src`` and the repository root on ``sys.path``.
"""
from __future__ import annotations

import numpy as np

from attnlab.core.request_lengths import draw, mixed_batch, starts_of  # noqa: F401 (the batches' lengths, for the benchmarks)
from benchmarks.results_folder import roofline_peaks
from benchmarks.serving.checks import check, references  # noqa: F401 (the checks, for the benchmarks)

B, S, H = 32, 32768, 128


def lengths_of(dist: str, T: int, rng) -> np.ndarray:
    """This benchmark's batch (B requests, caches of at most S) drawn from ``attnlab.core.request_lengths``."""
    return draw(dist, B, T, S, rng)


def time_ms(fn, args, repeats=10):
    """The median CUPTI kernel time of one call ``fn(*args)``, in ms."""
    from attnlab.measure import timers

    return timers.kernel_per_call(fn, [args], repeats).median


def kernels_ms(fn, args, iterations=5):
    """[(kernel name, median ms)] of one call, every kernel it launches (CUPTI)."""
    from jax.experimental.mosaic.gpu import profiler

    _, per_iter = profiler.measure(fn, aggregate=False, iterations=iterations)(*args)
    names = [n for n, _ in per_iter[0]]
    return [(n, float(np.median([it[i][1] for it in per_iter]))) for i, n in enumerate(names)]


def class_rooflines(q_len, kv, N, K, decode_max_q=16):
    """(decode class, prefill class) rooflines in ms: the two launches run one after the other, so a
    mixed batch's best is their sum, not the combined max(FLOPs, bytes) roofline."""
    from attnlab.core.serving_cost import serving_roofline_s

    out = []
    for sel in (q_len <= decode_max_q, q_len > decode_max_q):
        out.append(serving_roofline_s(starts_of(q_len[sel]), kv[sel], N, K, H, 2, **roofline_peaks()) * 1e3 if sel.any() else 0.0)
    return out


_JIT = {}


def jitted(key, make):
    """One jitted function per static key: cells that differ only in their (traced) lengths share it."""
    if key not in _JIT:
        _JIT[key] = make()
    return _JIT[key]


def caches(key, b, s, K, layout):
    """(k, v, page table) of ``b`` standard-normal bf16 caches of ``s`` tokens, K KV heads of H: contiguous
    (b, s, K, H) with no table for ``layout="contig"``, else pages (``"paged16"``: 16 tokens) and their table."""
    import jax
    import jax.numpy as jnp

    from attnlab.kernels.pages import to_pages

    k1, k2 = jax.random.split(key)
    k = jax.random.normal(k1, (b, s, K, H), jnp.bfloat16)
    v = jax.random.normal(k2, (b, s, K, H), jnp.bfloat16)
    if layout == "contig":
        return k, v, None
    kp, vp, table = to_pages(k, v, int(layout[5:]), seed=0)
    return kp, vp, jnp.asarray(table)
