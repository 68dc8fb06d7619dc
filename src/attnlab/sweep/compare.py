"""Compare two result sets cell by cell, telling a slowdown from noise.

Cells are matched by identity (``record_key``: backend, shape, dtype, mask, mode, mesh) and, for
``attnlab run`` folders, by the lab step that measured them. Each side's time is its headline
clock (CUPTI kernel time where measured, else wall clock) with the spread of its repeats
(``attnlab.core.records.timing``): median, min and 75th percentile.

**Slower** (a regression) needs all three:

1. the medians differ by more than the threshold: ``B.median > A.median * (1 + thr)``;
2. even B's fastest call is slower by the threshold: ``B.min > A.median * (1 + thr)``;
3. the two runs' spreads do not overlap: ``[A.min, A.p75]`` and ``[B.min, B.p75]`` are disjoint
   (``B.min > A.p75``).

**Faster** is the same rule with A and B swapped; everything else is **same**. A cell that was ok
in A and is not ok in B (incorrect, oom, ...) counts as a regression too ("failed"). A cell timed on both
sides (ok or unchecked, the same timer) is judged by its times even when its status differs (ok in A,
unchecked in B: B ran with --no-check); the note says the difference. Cells only in one file are counted
and listed, never judged. No cell in common is an error, not a pass; so is no common cell comparable
(``nothing_compared``).
"""
from __future__ import annotations

import dataclasses
import os

from ..measure.cell import record_key
from ..core.records import config_label, is_cell, timing
from ..core.store import read_records

VERDICTS = ("faster", "same", "slower", "failed", "not comparable", "only in A", "only in B")


class CompareError(ValueError):
    """Two result sets that cannot be compared (unreadable, empty, nothing in common)."""


def load(path) -> list[dict]:
    """The cell records of a results.jsonl file, or of the results.jsonl in a bench or run folder.

    Raises ``FileNotFoundError`` when there is no results file and ``CompareError`` when it holds no
    readable cell record."""
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "results.jsonl")
    if not os.path.exists(p):
        raise FileNotFoundError(f"no results at {path} (expected a results.jsonl file or a folder holding one)")
    try:
        recs = read_records(p)
    except (OSError, UnicodeDecodeError) as e:
        raise CompareError(f"{p}: cannot be read ({type(e).__name__}: {e})") from None
    cells = [r for r in recs if is_cell(r)]
    if not cells:
        raise CompareError(f"{p}: no cell records (read {len(recs)} readable record(s); "
                           "expected the results.jsonl of `attnlab bench` or `attnlab run`)")
    return cells


def cell_key(rec: dict) -> tuple:
    """A cell's identity; lab cells (``attnlab run``) also carry the step that measured them."""
    return (rec.get("step"), record_key(rec))


@dataclasses.dataclass
class Row:
    label: str
    backend: str
    a_ms: float | None
    b_ms: float | None
    ratio: float | None
    note: str = ""                      # "SLOWER", "faster", "", or why the cell was not judged
    verdict: str = "same"               # one of VERDICTS
    a_spread: tuple[float, float] | None = None   # (min, p75)
    b_spread: tuple[float, float] | None = None
    step: str | None = None


def _judge(ta: dict, tb: dict, thr: float) -> str:
    f = 1 + thr / 100
    if tb["median"] > ta["median"] * f and tb["min"] > ta["median"] * f and tb["min"] > ta["p75"]:
        return "slower"
    if ta["median"] > tb["median"] * f and ta["min"] > tb["median"] * f and ta["min"] > tb["p75"]:
        return "faster"
    return "same"


def compare(a: list[dict], b: list[dict], threshold_pct: float = 5.0) -> tuple[list[Row], bool]:
    """(rows, regressed): regressed when any common cell is slower in B (see the module doc) or failed in B.

    Raises ``CompareError`` when A and B have no cell in common."""
    ia = {cell_key(r): r for r in a if is_cell(r)}
    ib = {cell_key(r): r for r in b if is_cell(r)}
    if not set(ia) & set(ib):
        raise CompareError(f"no cell in common ({len(ia)} cells in A, {len(ib)} in B): nothing was compared")
    rows = []
    for k in list(ia) + [k for k in ib if k not in ia]:
        ra, rb = ia.get(k), ib.get(k)
        ref = ra or rb
        label, backend = config_label(ref), ref["backend"]
        if ref.get("step"):
            label = f"[{ref['step']}] {label}"
        ta = timing(ra) if ra and ra.get("status") in ("ok", "unchecked") else None
        tb = timing(rb) if rb and rb.get("status") in ("ok", "unchecked") else None
        row = Row(label, backend, ta and ta["median"], tb and tb["median"], None, step=ref.get("step"),
                  a_spread=ta and (ta["min"], ta["p75"]), b_spread=tb and (tb["min"], tb["p75"]))
        rows.append(row)
        if ra is None or rb is None:
            row.verdict = row.note = "only in " + ("B" if ra is None else "A")
            continue
        status = f"status A={ra.get('status')} B={rb.get('status')}"
        if ta is None or tb is None:
            row.note = status
            row.verdict = "failed" if ta is not None and tb is None else "not comparable"
            continue
        if ra.get("timer") != rb.get("timer"):
            row.verdict, row.note = "not comparable", f"timers differ: A {ra.get('timer')}, B {rb.get('timer')}"
            continue
        row.ratio = tb["median"] / ta["median"]   # both timed (ok or unchecked) by the same timer
        row.verdict = _judge(ta, tb, threshold_pct)
        row.note = "; ".join(x for x in ({"slower": "SLOWER", "faster": "faster", "same": ""}[row.verdict],
                                         status if ra.get("status") != rb.get("status") else "") if x)
    regressed = any(r.verdict in ("slower", "failed") for r in rows)
    return rows, regressed


def nothing_compared(rows: list[Row]) -> str | None:
    """Why no cell was compared (every common cell "not comparable"), or None when at least one was judged."""
    common = [r for r in rows if not r.verdict.startswith("only in")]
    if any(r.verdict != "not comparable" for r in common):
        return None
    return (f"nothing comparable: none of the {len(common)} cell(s) in common could be compared "
            f"(first: {common[0].backend} {common[0].label}: {common[0].note})" if common else "no cell in common")


def counts(rows: list[Row]) -> dict[str, int]:
    """How many cells got each verdict (every verdict named, zeros included)."""
    out = dict.fromkeys(VERDICTS, 0)
    for r in rows:
        out[r.verdict] += 1
    return out
