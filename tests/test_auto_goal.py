"""benchmarks/auto/held_out.py (the logic of benchmarks/auto/goal.py; issue 16, item 5) on a CPU:
the shape sets, the score on canned records, a tiny run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.api import dispatch
from attnlab.core.problem import Problem
from benchmarks.auto import held_out as goal

ROOT = Path(__file__).resolve().parents[1]


def test_heldout_is_disjoint_from_tune_and_inside_its_buckets():
    goal.check_sets()
    assert len(goal.HELDOUT) >= 8 and {m for _, m in goal.HELDOUT} == {"fwd", "fwd+bwd"}
    assert {p.head_dim for p, _ in goal.TUNE} == {64, 128, 256}
    assert all(p.q_len & (p.q_len - 1) == 0 for p, _ in goal.TUNE)         # tuned T: powers of two
    with pytest.raises(AssertionError, match="tuned"):
        goal.check_sets(heldout=goal.HELDOUT + [goal.TUNE[0]])
    with pytest.raises(AssertionError, match="outside"):
        goal.check_sets(heldout=[(Problem(1, 100, 100, 2, 2, 32, "bfloat16"), "fwd")])


def _rec(p, mode, backend, ms, status="ok"):
    return {"schema": 2, "backend": backend, **p.identity(), "mode": mode, "devices": 1, "strategy": None,
            "lengths": None, "status": status, "reason": None if status == "ok" else "canned",
            "timer": "cupti", "kernel_ms": ms if status == "ok" else None, "wall_ms": None,
            **({"rel_err": 0.002, "checked_fraction": 1.0, "tolerance": "canned", "checks": {}}
               if status == "ok" else {})}


A = Problem(1, 12288, 12288, 16, 16, 128, "bfloat16", causal=True)
B = Problem(2, 3072, 3072, 16, 16, 128, "bfloat16")
C = Problem(1, 3072, 3072, 16, 16, 256, "bfloat16")
CANNED = [
    _rec(A, "fwd", "cudnn", 1.72), _rec(A, "fwd", "tokamax-mosaic", 1.58), _rec(A, "fwd", "xla", 30.0),
    _rec(B, "fwd", "cudnn", 1.00), _rec(B, "fwd", "te", 1.03), _rec(B, "fwd", "torch-cudnn", 0.99),
    _rec(C, "fwd", "cudnn", 2.0), _rec(C, "fwd", "tokamax-mosaic", 1.0, "incorrect"), _rec(C, "fwd", "xla", 9.0),
]
PICKS = [
    {**A.identity(), "mode": "fwd", "auto": "tokamax-mosaic", "static": "cudnn", "auto_why": "measured"},
    {**B.identity(), "mode": "fwd", "auto": "te", "static": "cudnn", "auto_why": "measured"},
    {**C.identity(), "mode": "fwd", "auto": "tokamax-mosaic", "static": "cudnn", "auto_why": "measured"},
    {**Problem(1, 64, 64, 1, 1, 64).identity(), "mode": "fwd", "auto": "xla", "static": "xla"},   # not measured
]


def test_score_on_canned_records():
    rows = goal.score(CANNED, PICKS)
    assert [r["best"] for r in rows] == ["tokamax-mosaic", "torch-cudnn", "cudnn"]     # never the incorrect one
    a, b, c = rows
    assert a["auto_within"] and not a["static_within"]
    assert a["static_ratio"] == pytest.approx(1.72 / 1.58)
    assert b["auto_within"] and b["auto_ratio"] == pytest.approx(1.03 / 0.99)       # +4.0%: within 5%
    assert c["auto_ms"] is None and not c["auto_within"] and c["static_within"]    # an incorrect pick: a miss
    s = goal.summary(rows)
    assert (s["cells"], s["auto_within"], s["static_within"]) == (3, 2, 2) and not s["met"]
    md = goal.markdown(rows, s)
    assert "| B1 T12288 S12288 N16/16 H128 bfloat16 causal fwd | tokamax-mosaic 1.58 |" in md
    assert "on 2 of 3 held-out cells (67%; goal >= 95%: NOT met on the cells scored); static rule: 2 of 3." in md
    s10 = goal.summary(rows, held_out=5)
    assert s10["held_out"] == 5 and "Scored 3 of 5 held-out shapes (2 not measured" in goal.markdown(rows, s10)


def test_table_from_files(tmp_path):
    (tmp_path / "heldout").mkdir()
    (tmp_path / "heldout" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CANNED))
    (tmp_path / "picks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PICKS[:2]))
    s = goal.table(str(tmp_path))
    assert s["met"] and s["auto_fraction"] == 1.0 and s["static_within"] == 1
    assert json.loads((tmp_path / "goal.json").read_text())["summary"]["cells"] == 2
    assert "goal >= 95%: met" in (tmp_path / "goal.md").read_text()


def test_all_end_to_end_on_cpu_at_tiny_shapes(tmp_path):
    f32 = "float32"
    from attnlab.measure import Options

    goal.run("all", str(tmp_path), tune_shapes=[(Problem(1, 64, 64, 2, 2, 16, f32, causal=True), "fwd")],
             heldout_shapes=[(Problem(1, 48, 48, 2, 2, 16, f32, causal=True), "fwd")],
             tune_backends=["naive", "xla"], all_backends=["naive", "xla"],
             options=Options(repeats=3, min_time_s=0.0, pipelined_calls=2))
    t = dispatch.load(str(tmp_path / "dispatch.json"))
    (e,) = t.entries
    (pk,) = [json.loads(x) for x in (tmp_path / "picks.jsonl").read_text().splitlines()]
    assert pk["auto"] == e["backend"] and pk["static"] == "xla" and pk["auto_why"].startswith("measured")
    s = json.loads((tmp_path / "goal.json").read_text())["summary"]
    assert s["cells"] == 1
    assert os.environ.get(dispatch.ENV_VAR) is None      # the run's table does not leak into the process


def test_run_names_an_unknown_step(tmp_path):
    with pytest.raises(ValueError, match="what: 'score' is not one of all, tune, heldout, table"):
        goal.run("score", str(tmp_path))


def test_the_script_scores_a_folder(tmp_path):
    (tmp_path / "heldout").mkdir()
    (tmp_path / "heldout" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CANNED))
    (tmp_path / "picks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PICKS[:2]))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "auto" / "goal.py"), "--table", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "goal >= 95%: met" in r.stdout and json.loads((tmp_path / "goal.json").read_text())["summary"]["met"]
