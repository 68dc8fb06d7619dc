"""Rates in the unit that fits their size (no JAX: the lab's renderers and the CLI use them)."""
from __future__ import annotations


def format_flops(flop_per_s: float) -> str:
    """A FLOP rate in the unit that fits its size: TFLOP/s on a GPU, GFLOP/s (with decimals) on a CPU."""
    for scale, unit in ((1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if flop_per_s >= scale:
            return f"{_sig(flop_per_s / scale)} {unit}"
    return f"{flop_per_s:.3g} FLOP/s"


def format_bandwidth(bytes_per_s: float) -> str:
    """A memory bandwidth in GB/s (TB/s from 10 TB/s up), with decimals where it is small (a CPU)."""
    if bytes_per_s >= 1e13:
        return f"{_sig(bytes_per_s / 1e12)} TB/s"
    if bytes_per_s >= 1e9:
        return f"{_sig(bytes_per_s / 1e9)} GB/s"
    return f"{_sig(bytes_per_s / 1e6)} MB/s"


def _sig(x: float) -> str:
    """809.5, 3364, 12.35, 1.23: no decimal from 1000 up, one from 100, else two."""
    return f"{x:.0f}" if x >= 1000 else f"{x:.1f}" if x >= 100 else f"{x:.2f}"
