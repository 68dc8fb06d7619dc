"""Strong-scaling efficiency of sharded cells: t(1 device) / (n * t(n devices)) for the same global problem."""
from __future__ import annotations

from ..core.records import config_label, time_ms


def scaling_rows(records: list[dict]) -> list[dict]:
    ok = [r for r in records if r.get("status") == "ok" and r.get("strategy")]
    base = {}
    for r in ok:
        if r.get("devices", 1) == 1:
            base[(config_label(r, mesh=False), r["backend"], r["strategy"])] = time_ms(r)
    rows = []
    for r in sorted(ok, key=lambda r: (config_label(r, mesh=False), r["backend"], r["strategy"], r.get("devices", 1))):
        t1 = base.get((config_label(r, mesh=False), r["backend"], r["strategy"]))
        n = r.get("devices", 1)
        tn = time_ms(r)
        rows.append({"label": config_label(r, mesh=False), "backend": r["backend"], "strategy": r["strategy"], "devices": n,
                     "ms": tn, "ms_1": t1, "efficiency": (t1 / (n * tn)) if t1 and tn else None})
    return rows
