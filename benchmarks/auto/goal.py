"""Issue 16's goal for measured auto: on shapes it was NOT tuned on, auto within 5% of the best correct backend.

    PYTHONPATH=src python benchmarks/auto/goal.py all OUT [--max-seconds 400]   # tune, held-out, table
    PYTHONPATH=src python benchmarks/auto/goal.py tune OUT      # (a) TUNE shapes -> OUT/tune/, OUT/dispatch.json
    PYTHONPATH=src python benchmarks/auto/goal.py heldout OUT   # (b) HELDOUT shapes, every backend -> OUT/heldout/,
                                                                #     auto's and the static rule's picks -> OUT/picks.jsonl
    PYTHONPATH=src python benchmarks/auto/goal.py --table OUT   # (c) score -> OUT/goal.md, OUT/goal.json (no GPU needed)

(a) measures bf16 fwd and fwd+bwd, causal and not, MHA and GQA, H 64/128/256, T = S powers of two
1k-16k, with the JAX backends auto may pick (``api.auto_ineligible``), and writes the dispatch table
after each shape (so a time-out still leaves one). (b) measures other shapes — T = S of 3k, 6k, 12k,
other B and N, never a tuned shape (asserted), each in a tuned bucket (asserted) — with every backend
(PyTorch's too), and records the backend ``api.auto`` picks with OUT/dispatch.json and the one the
static rule (``backends.AUTO_ORDER``) picks. (c) for each held-out shape compares the picks' median
CUPTI kernel times (ms) with the fastest ``ok`` record: the goal is auto within 5% on >= 95% of cells.

Every cell is checked against the references before it is timed (the sweep engine); records are
written as they finish; ``--max-seconds`` (wall, for ``all``: the whole run, tune getting at most
TUNE_SHARE of it) stops *starting* new cells. The logic lives in ``benchmarks/auto/held_out.py``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.auto
from benchmarks.auto import held_out as auto_goal  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", nargs="?", choices=["all", "tune", "heldout", "table"], default=None)
    ap.add_argument("out")
    ap.add_argument("--table", action="store_true", help="score OUT (same as `table OUT`)")
    ap.add_argument("--max-seconds", type=float, default=390.0,
                    help="stop starting cells after this many seconds of wall time (all: tune + held-out)")
    a = ap.parse_args(argv)
    auto_goal.run("table" if a.table else (a.what or "all"), a.out, a.max_seconds)


if __name__ == "__main__":
    sys.exit(main())
