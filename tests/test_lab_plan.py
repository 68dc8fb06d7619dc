"""The lab sized to its questions (issue 22, item 4): each step times only the cells its answer needs,
shares the cells it can, and says in its text which cells ran and why."""
import pytest

from attnlab.lab import STEPS
from attnlab.lab.step_types import LabConfig
from attnlab.lab.steps import next_steps, te_fp8
from attnlab.lab.steps.te_fp8 import LAB_FP8_RECIPES

RECIPES = ["cudnn-fp8", "cudnn-fp8-pow2", "cudnn-fp8-hadamard", "cudnn-fp8-hadamard-fused", "cudnn-fp8-smoothk",
           "cudnn-fp8-hadamard-smoothk"]


@pytest.fixture
def h200(monkeypatch):
    """Every GPU path available (TransformerEngine and the FP8 recipes too), cuDNN accepting H <= 256."""
    monkeypatch.setattr(te_fp8, "_te_fp8_why", lambda: (None, {"te-fp8": None, "cudnn-fp8": None}))
    monkeypatch.setattr(te_fp8, "_recipes_why", lambda: {n: None for n in RECIPES})
    monkeypatch.setattr(next_steps, "_cudnn_verdicts", lambda cfg: (
        [[H, "accepts" if H <= 256 else "refuses: head dim 512 > 256"] for H in cfg.head_dims], None))


def plan(cfg):
    """{step: [distinct cell keys it measures first]} over the steps in order (a shared cell counts once)."""
    seen, out = set(), {}
    for sid, step in STEPS.items():
        keys = [c.key() for s in (step.sweeps(cfg) if step.sweeps else []) for c in s.cells()]
        out[sid] = [k for k in dict.fromkeys(keys) if k not in seen]
        seen.update(keys)
    return out


def test_the_full_gpu_lab_holds_about_40_cells(h200, monkeypatch):
    """127 cells before issue 22; at 1-3 s a GPU cell, the lab's 120 s (150 s with TransformerEngine).
    Decode: 9 cells of the main race, 2 at G = 7, 2 paged (issue 25), 2 serving batches (uniform, one-long) and 3
    model features at T = 1 (a window, sinks, an FP8 cache: 3 cells more, the limits raised by 3 for them)."""
    cells = plan(LabConfig.for_machine(False, True))
    counts = {sid: len(v) for sid, v in cells.items() if v}
    assert sum(counts.values()) <= 47, counts
    assert counts["timing"] == 2 and counts["decode"] <= 18, counts
    monkeypatch.setattr(te_fp8, "_te_fp8_why", lambda: ("not installed", {"te-fp8": "not installed", "cudnn-fp8": None}))
    assert sum(len(v) for v in plan(LabConfig.for_machine(False, True)).values()) <= 44


def test_quick_on_a_gpu_is_a_smoke_test_of_every_step(h200):
    cfg = LabConfig.for_machine(True, True)
    cells = plan(cfg)
    assert sum(len(v) for v in cells.values()) <= 17, {k: len(v) for k, v in cells.items()}   # decode: 2 serving
    measuring = [sid for sid, step in STEPS.items() if step.sweeps]
    assert {"timing", "sweeps", "gqa", "te_fp8", "next", "decode"} <= set(measuring)
    for sid in measuring:   # every measuring step times something
        assert any(s.cells() for s in STEPS[sid].sweeps(cfg)), sid
    assert max(c.q_len * c.kv_len for s in STEPS["sweeps"].sweeps(cfg) for c in s.cells()) <= 256 * 256


def test_cells_are_shared_between_steps(h200):
    """The timing step's cells, the batch sweep's default B, the head-dim sweep's default H and
    TransformerEngine's XLA/cuDNN baselines are the sequence sweep's own cells."""
    cfg = LabConfig.for_machine(False, True)
    keys = {sid: {c.key() for s in (STEPS[sid].sweeps(cfg) if STEPS[sid].sweeps else []) for c in s.cells()} for sid in STEPS}
    seq = {c.key() for s in STEPS["sweeps"].sweeps(cfg) if s.name == "seq_sweep" for c in s.cells()}
    assert keys["timing"] <= seq
    assert len(keys["next"] & seq) == 2 and len(keys["te_fp8"] & seq) == 4
    recipes = [c for s in STEPS["te_fp8"].sweeps(cfg) if s.name == "fp8-recipes" for c in s.cells()]
    assert {c.backend for c in recipes} == set(LAB_FP8_RECIPES) | {"cudnn"}


def test_every_measuring_step_says_which_cells_and_why():
    for cfg in (LabConfig.for_machine(False, True), LabConfig.for_machine(False, False), LabConfig.for_machine(True, False)):
        for sid in [sid for sid, step in STEPS.items() if step.sweeps]:
            note = STEPS[sid].cells_note(cfg)
            assert note.startswith("Cells: ") and len(note) > 40, (sid, note)


def _gqa(K, ms):
    return {"kind": "cell", "step": "gqa", "backend": "xla", "batch": 4, "q_len": 128, "kv_len": 128, "heads": 8,
            "kv_heads": K, "head_dim": 64, "dtype": "float32", "causal": True, "status": "ok", "rel_err": 1e-7,
            "timer": "wall", "wall_ms": ms, "kernel_ms": None, "wall_p25_ms": ms * 0.95, "wall_p75_ms": ms * 1.05}


def test_gqa_slower_than_mha_gets_its_measured_explanation():
    """Issue 23 item 7: a GQA time that contradicts "same FLOPs as MHA" is explained from XLA's compiled programs."""
    from attnlab.lab.steps.gqa import render as render_gqa

    probe = {"kind": "lab_step", "step": "gqa", "status": "ok", "probe": {"xla_programs": {
        "MHA": {"K": 8, "dots": [["f32", [4, 8, 128, 128]]], "copy_bytes": 4_000_000},
        "GQA": {"K": 2, "dots": [["f32", [4, 2, 512, 128]]], "copy_bytes": 6_000_000},
        "MQA": {"K": 1, "dots": [["f32", [4, 1024, 128]]], "copy_bytes": 5_000_000}}}}
    cfg = LabConfig.for_machine(False, False)
    slow = render_gqa([probe, _gqa(8, 6.4), _gqa(2, 17.2), _gqa(1, 6.5)], cfg, None)
    text = " ".join(slow.paragraphs)
    assert "slower at K=2" in text and "same at K=1" in text and "32 matmuls of 128×128" in text and "8 matmuls of 512×128" in text
    same = render_gqa([probe, _gqa(8, 6.4), _gqa(2, 6.5), _gqa(1, 6.3)], cfg, None)
    assert not any("compiled programs show why" in p for p in same.paragraphs)
