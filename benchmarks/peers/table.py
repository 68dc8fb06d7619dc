"""Markdown tables of a peers sweep (results/gpu-*-peers*/results.jsonl): TFLOP/s, GB/s, % of peak.

    python3 benchmarks/peers/table.py results/gpu-2026-12-03-peers/results.jsonl

One clock per table: every number is CUPTI kernel time unless marked † (another timer, named in
the footnote). A cell that failed its check shows its status and, below the table, its reason.
Under each table: how much of the output and which gradients the records say were checked.
The tables are made by attnlab.report.peers_table; this script reads the file and prints them.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src"))

from attnlab.report.peers_table import tables  # noqa: E402


def main(path):
    with open(path) as f:
        recs = [json.loads(line) for line in f]
    for text in tables(recs):
        print(text)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # the repository root
    from benchmarks.results_folder import script_args  # noqa: E402 (after sys.path)

    main(script_args(__doc__)[0])
