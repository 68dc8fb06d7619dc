"""A GPU benchmark's output folder: ``results.jsonl`` (one record a line, written as each finishes) and
``README.md`` (the command that ran and the tables), with the device's name and the seconds since the start.

    out = ResultsFolder(args.out)                 # makes the folder; out.device, out.path, out.t0
    with open(out.path, "w") as f: ...            # each record: f.write(json.dumps(rec) + "\n"); f.flush()
    out.finish("Attention sinks", "python benchmarks/decode/sinks_gpu.py --out OUT", table_md(out.path))
"""
from __future__ import annotations

import functools
import json
import os
import sys
import time


def script_args(doc: str, needed: int = 1, options=("--table", "--child")) -> list[str]:
    """A script's arguments (``sys.argv[1:]``) where it reads them by position: with ``-h``/``--help`` it prints
    ``doc`` (its usage) and exits 0; with fewer than ``needed``, or an option first that is not one of the
    script's ``options`` where a folder or file goes, it prints ``doc`` and exits 2 (before any folder is made)."""
    args = sys.argv[1:]
    if "-h" in args or "--help" in args:
        print(doc)
        sys.exit(0)
    if len(args) < needed or (args and args[0].startswith("-") and args[0] not in options):
        print(doc, file=sys.stderr)
        sys.exit(2)
    return args


class ResultsFolder:
    def __init__(self, out: str):
        import jax

        os.makedirs(out, exist_ok=True)
        self.out = out
        self.path = os.path.join(out, "results.jsonl")
        self.t0 = time.perf_counter()
        self.device = str(jax.devices()[0].device_kind)

    def seconds(self) -> float:
        """Seconds since the folder was opened."""
        return time.perf_counter() - self.t0

    def finish(self, title: str, command: str, tables_md: str) -> None:
        """Writes README.md ("# TITLE on DEVICE", the command, the tables) and prints the tables and the time."""
        with open(os.path.join(self.out, "README.md"), "w", encoding="utf-8") as f:
            f.write(f"# {title} on {self.device}\n\n`PYTHONPATH=src {command}`\n\n" + tables_md)
        print(tables_md)
        print(json.dumps({"out": self.out, "seconds": round(self.seconds(), 1)}))


@functools.cache
def roofline_peaks() -> dict:
    """This process's GPU as ``serving_roofline_s`` takes it: ``bandwidth`` (bytes/s) and ``peak_flops``
    (dense bf16 FLOP/s) from attnlab's datasheet; the H200's where the device is not in it."""
    import jax

    from attnlab.core.datasheet import PEAKS, peak_for_kind

    p = peak_for_kind(str(jax.devices()[0].device_kind)) or PEAKS["H200"]
    return {"bandwidth": p.hbm_tbps * 1e12, "peak_flops": p.tflops["bf16"] * 1e12}
