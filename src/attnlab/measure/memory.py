"""Memory a compiled attention costs: XLA's compiled analysis, and the process's device high-water mark."""
from __future__ import annotations

import jax


def compiled_memory(compiled) -> dict:
    """temp/argument/output/alias bytes from ``compiled.memory_analysis()`` (CPU and GPU), and their peak."""
    try:
        m = compiled.memory_analysis()
    except Exception:
        m = None
    if m is None:
        return {"temp_bytes": None, "argument_bytes": None, "output_bytes": None, "peak_bytes": None}
    temp = int(getattr(m, "temp_size_in_bytes", 0))
    arg = int(getattr(m, "argument_size_in_bytes", 0))
    out = int(getattr(m, "output_size_in_bytes", 0))
    alias = int(getattr(m, "alias_size_in_bytes", 0))
    return {"temp_bytes": temp, "argument_bytes": arg, "output_bytes": out,
            "peak_bytes": temp + arg + out - alias}


def device_memory_stats() -> dict | None:
    """The default device's allocator statistics (GPU), or None where the platform has none."""
    try:
        return jax.devices()[0].memory_stats()
    except Exception:
        return None


def process_peak_bytes() -> int | None:
    """Peak bytes in use on the device since the *process* started (GPU allocator), or None.

    JAX's allocator cannot reset its peak, so this is the process's high-water mark when it is
    read, not one cell's peak; a cell's own compiled footprint is ``compiled_memory``'s peak."""
    s = device_memory_stats()
    return None if not s else s.get("peak_bytes_in_use")


def device_bytes_limit() -> int | None:
    s = device_memory_stats()
    return None if not s else s.get("bytes_limit")


def over_limit(peak_bytes, max_bytes=None) -> str | None:
    """Why a compiled program of ``peak_bytes`` must not run: over ``max_bytes`` (``Options.max_bytes``), else over
    the device's limit; None when it fits or either is unknown."""
    limit = max_bytes or device_bytes_limit()
    if limit and peak_bytes and peak_bytes > limit:
        return f"compiled peak {peak_bytes} bytes > device limit {limit} bytes; not run"
    return None
