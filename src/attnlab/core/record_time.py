"""The headline time of a flat record and the spread of its repeats (read by the schema, the rate
check, the report and compare)."""
from __future__ import annotations


def time_ms(rec) -> float | None:
    """The record's headline time: kernel time where measured, else wall time."""
    return rec.get("kernel_ms") if rec.get("kernel_ms") is not None else rec.get("wall_ms")


def timing(rec) -> dict | None:
    """The headline time of a timed record and its spread: {"clock", "median", "min", "p25", "p75", "max", "spread"}.

    The clock is kernel time where measured, else wall time. ``spread`` says what the spread is
    made of: "recorded" (min and p75 stored), "estimated" (p25/p75 bounded from the IQR of an
    older file) or "none" (only a median stored: min = p25 = p75 = median)."""
    prefix = "kernel" if rec.get("kernel_ms") is not None else "wall"
    med = time_ms(rec)
    if med is None:
        return None
    lo, p25, p75, hi, iqr = (rec.get(f"{prefix}_{k}_ms") for k in ("min", "p25", "p75", "max", "iqr"))
    spread = "recorded"
    if p75 is None:
        if iqr is not None:
            p75, spread = med + iqr, "estimated"
            if hi is not None:
                p75 = min(hi, p75)
        else:
            p75, spread = med, "none"
    if lo is None:
        lo = med
    if p25 is None:
        p25 = max(lo, med - iqr) if iqr is not None else lo
    return {"clock": prefix, "median": med, "min": min(lo, med), "p25": min(p25, med), "p75": max(p75, med),
            "max": max(hi if hi is not None else p75, med), "spread": spread}
