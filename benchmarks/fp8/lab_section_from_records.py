"""The lab's FP8-recipe part (step ``te_fp8``) rendered from a ``benchmarks/fp8/recipes.py`` results file (no JAX).

    python3 benchmarks/fp8/lab_section_from_records.py results/gpu-2026-12-03c-fp8-recipes/fp8-recipes/results.jsonl

The lab's own FP8-recipe sweep (``attnlab.lab.steps.te_fp8.sweeps``: every recipe + cudnn, T = S = 4096
causal, H = 128, gaussian and channel-outliers inputs) is a subset of that grid; this takes those cells,
tags them as the lab's, and prints what ``attnlab.lab.steps.te_fp8.render`` makes of them (markdown).
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))


def main(path: str) -> str:
    from attnlab.lab.steps.te_fp8 import FP8_RECIPE_INPUTS, fp8_recipes_part
    from attnlab.lab.step_types import Section
    from attnlab.lab.steps import STEPS

    recs = []
    for line in open(path):
        r = json.loads(line)
        if r["q_len"] == 4096 and r["causal"] and r.get("inputs", "gaussian") in FP8_RECIPE_INPUTS:
            recs.append({**r, "kind": "cell", "step": "fp8-recipes"})
    s = Section("te_fp8", f"{STEPS['te_fp8'].title} (the FP8-recipe part, from the H200 records)")
    fp8_recipes_part(recs, {"recipes_why": {}}, s)
    out = [f"## {s.title}", ""]
    for t in s.tables:
        out += [f"**{t.title}**", "", "| " + " | ".join(t.columns) + " |", "|" + " --- |" * len(t.columns)]
        out += ["| " + " | ".join(str(c) for c in row) + " |" for row in t.rows] + [""]
    out += s.paragraphs
    return "\n".join(out)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # the repository root
    from benchmarks.results_folder import script_args  # noqa: E402 (after sys.path)

    print(main(script_args(__doc__)[0]))
