"""What the GPU reads at the sizes of attnlab's small decode and serving cells: the floor under their % of roofline.

    PYTHONPATH=src python benchmarks/decode/read_floor_gpu.py --out OUT [--dry-run]

A decode step of a few tens of MB (a skewed serving batch: 58k valid tokens at K=8, H=128, bf16 are 240 MB; a
128-token window over 256 requests, 64 MB) lasts tens of microseconds, where a kernel's ramp and tail weigh. This
times XLA's own reads of the same bytes (CUPTI, the median of 20 calls, ``measure.timers.kernel_per_call``):
``sum`` reduces a (rows, 4096) bf16 array to float32 per row (reads every byte once, writes almost nothing);
``copy`` adds 1 to it (reads and writes every byte). % of the datasheet's bandwidth (H200 4.8 TB/s), counting the
bytes read (``sum``) or read and written (``copy``). Sizes 8 MB to 2 GB.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))   # the repository root: benchmarks

from benchmarks.results_folder import ResultsFolder, roofline_peaks  # noqa: E402 (after sys.path)

SIZES_MB = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)
COLS = 4096


def run(f, dev, dry: bool):
    import jax
    import jax.numpy as jnp

    from attnlab.measure import timers

    bw = roofline_peaks()["bandwidth"]
    ops = {"sum": (jax.jit(lambda x: jnp.sum(x, axis=1, dtype=jnp.float32)), 1),
           "copy": (jax.jit(lambda x: x + jnp.ones((), x.dtype)), 2)}
    for mb in SIZES_MB[:2] if dry else SIZES_MB:
        x = jnp.ones((mb * 2**20 // (2 * COLS), COLS), jnp.bfloat16)
        for name, (fn, passes) in ops.items():
            jax.block_until_ready(fn(x))
            ms = timers.wall_per_call(fn, [(x,)], 3).median if dry else timers.kernel_per_call(fn, [(x,)], 20).median
            nbytes = passes * x.size * 2
            rec = dict(kind="read-floor", device=dev, op=name, mb=mb, bytes=nbytes, ms=ms,
                       pct_bandwidth=100 * nbytes / bw / (ms * 1e-3))
            f.write(json.dumps(rec) + "\n")
            f.flush()
        del x


def table_md(path) -> str:
    recs = [json.loads(line) for line in open(path)]
    by = {(r["mb"], r["op"]): r for r in recs}
    lines = ["| MB of the array | sum: ms | sum: % of bandwidth | copy: ms | copy: % of bandwidth |",
             "| --- | --- | --- | --- | --- |"]
    for mb in dict.fromkeys(r["mb"] for r in recs):
        cells = [f"{by[mb, op]['ms']:.4f} | {by[mb, op]['pct_bandwidth']:.0f}%" if (mb, op) in by else "– | –"
                 for op in ("sum", "copy")]
        lines.append(f"| {mb} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="two small sizes on any device (the times mean nothing)")
    a = ap.parse_args(argv)
    out = ResultsFolder(a.out)
    with open(out.path, "w") as f:
        run(f, out.device, a.dry_run)
    flags = " --dry-run" if a.dry_run else ""
    out.finish("Reads at decode sizes", f"python benchmarks/decode/read_floor_gpu.py --out {a.out}{flags}",
               table_md(out.path))


if __name__ == "__main__":
    main()
