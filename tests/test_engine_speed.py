"""benchmarks/engine/speed.py and its package module: the goals' verdicts, and a --quick run on the CPU."""
import importlib.util
import json
import os

from benchmarks.engine import cost as engine_speed


def _rec(backend, T, cell_s, timing_s, wait_s=0.0, check_s=0.1, mode="fwd"):
    return {"backend": backend, "batch": 1, "q_len": T, "kv_len": T, "heads": 2, "kv_heads": 2, "head_dim": 16,
            "dtype": "float32", "causal": True, "window": None, "mode": mode, "status": "ok", "cell_s": cell_s,
            "timing_s": timing_s, "compile_wait_s": wait_s, "compile_s": wait_s, "check_s": check_s, "inputs_s": 0.01,
            "checked_fraction": 1.0}


def test_summary_judges_the_goals_and_says_by_how_much():
    recs = [_rec("xla", 64, 3.0, 0.5, 0.5, 1.8), _rec("naive", 64, 1.0, 0.6, 0.2), _rec("naive", 64, 0.9, 0.6, 0.1, mode="fwd+bwd"),
            _rec("xla", 128, 1.2, 0.5, 0.1, 0.5), _rec("naive", 128, 0.8, 0.6)]
    s = engine_speed.summary(recs, wall_s=700.0)
    # overheads (cell - compile wait - timing): 2.0, 0.2, 0.2, 0.6, 0.2 -> median 0.2
    assert abs(s["median_overhead_s"] - 0.2) < 1e-9 and s["cells"] == 5
    assert [f["backend"] for f in s["first_of_shape"]] == ["xla", "xla"]
    med, first, sweep = s["goals"]
    assert med["met"] and abs(med["by_s"] - 0.1) < 1e-9
    assert first["met"] is True and first["measured_s"] == 2.0
    assert sweep["met"] is False and sweep["by_s"] == -100.0
    md = engine_speed.markdown({"device": "cpu", "peers": s})
    assert "missed by 100 s" in md and "| first cell of a shape |" in md
    assert engine_speed.summary(recs, 10.0, complete=False)["goals"][2]["met"] is None


def test_quick_run_of_the_benchmark_script_on_the_cpu(tmp_path):
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "engine", "speed.py")
    spec = importlib.util.spec_from_file_location("engine_speed_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--out", str(tmp_path), "--quick"])
    res = json.loads((tmp_path / "engine_speed.json").read_text())
    p = res["peers"]
    assert p["complete"] and p["cells"] == 8 and p["statuses"] == {"ok": 8}
    assert p["cost_summary"].startswith("8 cells in ")
    assert len(p["first_of_shape"]) == 2 and {g["goal"].split(" ")[0] for g in p["goals"]} == {"median", "first", "peers"}
    assert "# engine speed on cpu" in (tmp_path / "engine_speed.md").read_text()


def test_records_from_before_the_cost_fields_count_timing_as_overhead():
    old = {k: v for k, v in _rec("xla", 64, 3.0, None).items() if k not in ("timing_s", "compile_wait_s", "check_s")}
    old.update(compile_s=0.5)
    s = engine_speed.summary([old], 3.0)
    assert s["median_overhead_s"] == 2.5 and [f["overhead_s"] for f in s["first_of_shape"]] == [2.5]


def test_a_cell_of_two_sweeps_is_counted_once(tmp_path, monkeypatch):
    """The peers sweep's parts share a folder; cuDNN's and TE's cells in the FP8 part are the fwd part's (the H200
    summary at f2324ca counted 202 cells for 194 records before this)."""
    from attnlab.sweep import Sweep

    grid = dict(batch=[1], q_len=[32], heads=[2], head_dim=[16], dtype=["float32"], causal=[True])
    monkeypatch.setattr(engine_speed, "peers_sweeps", lambda quick=False: [
        Sweep(["naive", "xla"], name="a", **grid), Sweep(["naive"], name="b", **grid)])
    s = engine_speed.measure(str(tmp_path), quick=True)
    assert s["cells"] == 2 and s["cost_summary"].startswith("2 cells in ")
