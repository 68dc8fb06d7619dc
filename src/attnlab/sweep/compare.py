"""Compare two result sets cell by cell: ratio = B's time / A's time (kernel time where measured)."""
from __future__ import annotations

import dataclasses
import os

from ..measure.cell import record_key
from ..store import read_records
from .engine import config_label, time_ms


def load(path) -> list[dict]:
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "results.jsonl")
    if not os.path.exists(p):
        raise FileNotFoundError(f"no results at {path} (expected a results.jsonl file or a folder holding one)")
    return [r for r in read_records(p) if "backend" in r]


@dataclasses.dataclass
class Row:
    label: str
    backend: str
    a_ms: float | None
    b_ms: float | None
    ratio: float | None
    note: str = ""


def compare(a: list[dict], b: list[dict], threshold_pct: float = 5.0) -> tuple[list[Row], bool]:
    """(rows, regressed): regressed when any common ok cell of B is slower than A by more than threshold."""
    ia = {record_key(r): r for r in a}
    ib = {record_key(r): r for r in b}
    rows, regressed = [], False
    for k in list(ia) + [k for k in ib if k not in ia]:
        ra, rb = ia.get(k), ib.get(k)
        ref = ra or rb
        label, backend = config_label(ref), ref["backend"]
        if ra is None or rb is None:
            rows.append(Row(label, backend, ra and time_ms(ra), rb and time_ms(rb), None, "only in " + ("B" if ra is None else "A")))
            continue
        ta, tb = time_ms(ra), time_ms(rb)
        if ra.get("status") != "ok" or rb.get("status") != "ok" or not ta or not tb:
            rows.append(Row(label, backend, ta, tb, None, f"status A={ra.get('status')} B={rb.get('status')}"))
            continue
        if ra.get("timer") != rb.get("timer"):
            rows.append(Row(label, backend, ta, tb, None, f"timers differ: A {ra.get('timer')}, B {rb.get('timer')}"))
            continue
        ratio = tb / ta
        slow = ratio > 1 + threshold_pct / 100
        regressed |= slow
        rows.append(Row(label, backend, ta, tb, ratio, "SLOWER" if slow else ""))
    return rows, regressed
