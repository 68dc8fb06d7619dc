"""Issue 25 check on the H200 (~60-80 s): paged (page 16, 64) vs contiguous attnlab-decode where paged was slow.

    PYTHONPATH=src python3 benchmarks/decode/paged_vs_contiguous_gpu.py OUT_DIR

B=8, S=32768, H=128, bf16, causal; (N, K) = (28, 4) and (64, 8); T = 4, 16 (12 sweep cells, each
output checked). Prints kernel ms and paged / contiguous per shape; the goal is <= 1.05.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

PAIRS = [(28, 4), (64, 8)]


def main(out_dir: str) -> None:
    from attnlab.sweep import Sweep, run_sweep

    recs = []
    for n, k in PAIRS:
        sw = Sweep(["attnlab-decode"], batch=[8], kv_len=[32768], heads=[n], kv_heads=[k], head_dim=[128],
                   dtype=["bfloat16"], causal=[True], q_len=[4, 16], lengths=["full", "paged16", "paged64"],
                   name=f"paged25_{n}_{k}")
        recs += run_sweep(sw, os.path.join(out_dir, f"{n}x{k}"), overwrite=True)
    base = {(r["heads"], r["kv_heads"], r["q_len"]): r["kernel_ms"] for r in recs
            if r["status"] == "ok" and r["lengths"] == "full"}
    for r in recs:
        key = (r["heads"], r["kv_heads"], r["q_len"])
        tag = r["lengths"] + (str(r["page_size"]) if r.get("page_size") else "")
        ratio = r["kernel_ms"] / base[key] if r["status"] == "ok" and key in base else float("nan")
        print(f"N/K={key[0]}/{key[1]} T={key[2]:>2} {tag:>8} {r['status']:>4} {r.get('kernel_ms') or 0:.4f} ms  x{ratio:.3f}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # the repository root
    from benchmarks.results_folder import script_args  # noqa: E402 (after sys.path)

    main(script_args(__doc__)[0])
