"""Issue 22's measuring-engine benchmark: the peers sweep's cost cell by cell, and optionally a cold lab run.

    PYTHONPATH=src python3 benchmarks/engine/speed.py --out OUT [--quick] [--lab | --lab-only] [--max-seconds 480]

Writes OUT/engine_speed.json and OUT/engine_speed.md (goals met / missed by how much, where the time went).
The logic lives in benchmarks/engine/cost.py.
"""
import argparse
import json
import os
import sys
from pathlib import Path

from attnlab.core import device
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.engine
from benchmarks.engine import cost as engine_speed  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="a tiny grid (a CPU runs it in seconds)")
    ap.add_argument("--lab", action="store_true", help="also time a cold `attnlab run` (with --quick: run --quick)")
    ap.add_argument("--lab-only", action="store_true", help="only the cold `attnlab run`, no peers sweep")
    ap.add_argument("--from-records", metavar="RESULTS_JSONL",
                    help="summarise an existing sweep's records instead of running one (e.g. a peers sweep from before "
                         "issue 22: records without timing_s count their timing as overhead)")
    ap.add_argument("--max-seconds", type=float, default=480.0, help="stop the peers sweep after this long")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    info = device.current()
    if args.from_records:
        from attnlab.core.store import read_records

        recs = read_records(args.from_records)
        peers = engine_speed.summary(recs, sum(r.get("cell_s") or 0.0 for r in recs))
        info = type(info)(info.platform, next((r["env"].get("device_kind") for r in recs if isinstance(r.get("env"), dict)),
                                              "?"), info.count)
    elif args.lab_only:
        peers = engine_speed.summary([], 0.0, complete=False)
    else:
        peers = engine_speed.measure(args.out, args.quick, args.max_seconds)
    result = {"device": info.kind, "peers": peers}
    if args.lab or args.lab_only:
        result["lab"] = engine_speed.lab_run(args.out, args.quick)
    with open(os.path.join(args.out, "engine_speed.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, default=str)
    md = engine_speed.markdown(result)
    with open(os.path.join(args.out, "engine_speed.md"), "w", encoding="utf-8") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
