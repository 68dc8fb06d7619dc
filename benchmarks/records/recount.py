"""Recount the FLOPs and bytes of stored records with today's counter, and check each rate against its
device's datasheet peak (``attnlab.measure.recount``, ``attnlab.core.rate_check``).

    python benchmarks/records/recount.py [DIR ...] [--write]

Lists every cell record (of every ``*.jsonl`` under DIR, default ``results``) whose ``flops`` or ``bytes``
the counter changes, and every record above the datasheet peak, stored or recounted; exits 1 when one
is above. ``--write`` rewrites the changed lines in place (other lines byte for byte as they were).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

from attnlab.core.rate_check import RateAbovePeakError, check_rates
from attnlab.core.records import is_cell, upgrade
from attnlab.measure.recount import recount


def scan(path: str, write: bool) -> tuple[int, int]:
    """(records whose counts change, records above the peak) of one JSONL file."""
    changed = above = 0
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not (isinstance(rec, dict) and is_cell(rec)):
            continue
        new = recount(upgrade(rec))
        for label, r in (("stored", upgrade(rec)), ("recounted", new)):
            try:
                check_rates(r, f"{path}: record {i + 1} ({label}): ")
            except RateAbovePeakError as e:
                above += 1
                print(e)
        if any(new.get(k) != rec.get(k) for k in ("flops", "bytes")):
            changed += 1
            print(f"{path}: record {i + 1}: flops {rec.get('flops')} -> {new['flops']}, bytes {rec.get('bytes')} -> "
                  f"{new['bytes']}")
            lines[i] = json.dumps({**rec, **{k: new[k] for k in new if new[k] != rec.get(k) and k in rec}}) + "\n"
    if write and changed:
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(lines)
    return changed, above


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", default=["results"])
    ap.add_argument("--write", action="store_true", help="rewrite the changed records in place")
    a = ap.parse_args(argv)
    files = sorted(p for d in a.dirs for p in glob.glob(os.path.join(d, "**", "*.jsonl"), recursive=True))
    changed = above = 0
    for p in files:
        c, ab = scan(p, a.write)
        changed, above = changed + c, above + ab
    print(f"{len(files)} files: {changed} record(s) recounted differently, {above} above the datasheet peak")
    return 1 if above else 0


if __name__ == "__main__":
    sys.exit(main())
