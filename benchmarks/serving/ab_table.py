"""The serving benchmarks' A/B tables: one row per cell, its variants' times side by side, their speed-ups.

A record (one line of results.jsonl) has a ``kind``, the fields that name its cell, the field that names its variant,
and ``ms`` with ``pct_roofline`` (or ``error``); with ``kernels`` [[name, ms], ...] its kernels can be listed too.
"""
from __future__ import annotations

import json


def read(path) -> list[dict]:
    """The records of a results.jsonl."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


def ms(r, error_chars: int = 40) -> str:
    """"0.1234 (56%)": a record's ms and % of its roofline; "✗ why" where it failed; "–" where there is none."""
    if not r:
        return "–"
    return f"{r['ms']:.4f} ({r['pct_roofline']:.0f}%)" if r.get("ms") else f"✗ {(r.get('error') or '')[:error_chars]}"


def ratio(a, b) -> str:
    """How many times faster b ran than a ("1.23x"), or "–" where either has no time."""
    return f"{a['ms'] / b['ms']:.2f}x" if a and b and a.get("ms") and b.get("ms") else "–"


def kernels(r) -> str:
    """A call's kernels, short: "name-tail us" each (the zero fill and XLA's own kernels under their names)."""
    return ", ".join(f"{n.replace('attnlab_serving_', '')[:28]} {t * 1e3:.1f}us" for n, t in (r or {}).get("kernels") or [])


def ab_table(recs, *, kind: str, cell: tuple[str, ...], variant: str, variants: tuple, headers: tuple[str, ...],
             title: str, ratios=((0, -1),), kernels_of: tuple[int, ...] = (), error_chars: int = 40) -> list[str]:
    """Markdown lines: ``title``, then a table of the records of ``kind``, one row per ``cell`` (its fields' values),
    a column per ``variants`` value of the ``variant`` field, a speed-up column per (a, b) in ``ratios`` (variant
    indices), and the kernels of each variant index in ``kernels_of``. ``headers``: the cell's, variants', speed-ups'
    and kernels' column names, in that order. No lines where no record is of ``kind``."""
    cells = {tuple(r[f] for f in cell) + (r[variant],): r for r in recs if r.get("kind") == kind}
    if not cells:
        return []
    lines = [title, "", "| " + " | ".join(headers) + " |", "| --- " * len(headers) + "|"]
    for key in dict.fromkeys(x[:-1] for x in cells):
        row = [cells.get((*key, v)) for v in variants]
        lines.append("| " + " | ".join([*map(str, key), *(ms(r, error_chars) for r in row),
                                        *(ratio(row[a], row[b]) for a, b in ratios),
                                        *(kernels(row[i]) for i in kernels_of)]) + " |")
    return lines
