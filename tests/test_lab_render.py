"""The lab's steps as sweeps with pure renderers (issue 14, item 5).

Renderers are pure: they build every section of ``attnlab run`` from records alone (canned:
tests/data/lab_quick_cpu.jsonl, a real CPU ``attnlab run --quick``'s results.jsonl, env dropped)
and import no JAX. The measuring steps' cells run through the sweep engine, so a stopped run
resumes without measuring again what it had measured.
"""
import json
import os
import subprocess
import sys

import pytest

CANNED = os.path.join(os.path.dirname(__file__), "data", "lab_quick_cpu.jsonl")
from attnlab.lab.steps import MODULES, STEPS

STEP_IDS = list(STEPS)   # the registry's order (attnlab.lab.steps.MODULES)

RENDER_ALL = r"""
import json, sys
import attnlab.lab.render as render
from attnlab.lab.step_types import LabConfig
from attnlab.report.html import render as html
from attnlab.core.store import read_records

recs = read_records(sys.argv[1])
secs = render.render_all(recs, LabConfig.for_machine(True, False), sys.argv[2])
page = html(secs, {"device_kind": "cpu", "platform": "cpu", "jax": "x", "cudnn": None, "attnlab": "0", "git_commit": None})
assert "jax" not in sys.modules, sorted(m for m in sys.modules if m.startswith("jax"))[:5]
print(json.dumps({"page": len(page), "sections": [
    {"id": s.id, "status": s.status, "facts": s.facts, "plots": s.plots,
     "tables": [{"title": t.title, "columns": t.columns, "rows": t.rows} for t in s.tables]} for s in secs]}))
"""


def _canned():
    return [json.loads(line) for line in open(CANNED, encoding="utf-8")]


def _stored_facts(rec):
    return {k: v for k, v in rec.items() if k not in ("kind", "step", "title", "status", "reason", "seconds", "probe", "label", "env")}


def test_every_step_renders_from_canned_records_without_jax(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "src"),
                                                         os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", RENDER_ALL, CANNED, str(tmp_path / "plots")], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    secs = {s["id"]: s for s in out["sections"]}
    stored = {x["step"]: x for x in _canned() if x["kind"] == "lab_step"}
    # every step the canned run holds renders, in the registry's order (a step added since renders from no
    # records: test_renderers_skip_a_step_without_records; a fresh `attnlab run --quick` on a CPU adds it here)
    assert list(secs) == [sid for sid in STEP_IDS if sid in stored] and set(stored) <= set(STEP_IDS)
    assert len(secs) >= 12   # the canned run holds every step of its day: not fewer
    for sid, s in secs.items():
        assert s["status"] == stored[sid]["status"], sid
        assert s["facts"] == _stored_facts(stored[sid]), sid     # the stored facts came from this renderer
    tables = {t["title"]: t for s in secs.values() for t in s["tables"]}
    seq = next(t for k, t in tables.items() if k.startswith("Sequence sweep"))
    assert seq["columns"] == ["q_len", "naive", "xla"] and all("GFLOP/s" in c for r in seq["rows"] for c in r[1:])
    timing = next(t for k, t in tables.items() if k.startswith("Wall time per call, no kernel time"))
    assert [r[:2] for r in timing["rows"]] == [["naive", "float32"], ["xla", "float32"]]
    assert any(k.startswith("Compiled temp memory") for k in tables) and any(k.startswith("Head-dim sweep") for k in tables)
    assert any(k.startswith("Backends available here") for k in tables)
    assert secs["decode"]["facts"]["cells"] == 2
    assert any(r["kind"] == "run" for r in _canned())     # the run record is read past by every renderer
    plots = [p for s in secs.values() for p in s["plots"]]
    assert len(plots) >= 5 and all(os.path.exists(p) for p in plots)
    assert out["page"] > 10_000


def test_renderers_skip_a_step_without_records():
    from attnlab.lab.step_types import LabConfig
    from attnlab.lab.render import RENDERERS

    for sid, render in RENDERERS.items():
        s = render([], LabConfig.for_machine(True, False), None)
        assert s.id == sid and s.status == "skipped" and s.reason, sid


@pytest.mark.parametrize("sid,tag", [("timing", "timing"), ("sweeps", "seq_sweep"), ("next", "head_dim"),
                                     ("gqa", "gqa"), ("decode", None)])
def test_a_step_whose_cell_failed_fails(sid, tag):
    """A step showing a wrong or broken cell is failed (and `attnlab run` exits 1), never ok."""
    from attnlab.lab.step_types import LabConfig
    from attnlab.lab.render import RENDERERS

    cfg = LabConfig.for_machine(True, False)
    assert RENDERERS[sid](_canned(), cfg, None).status == "ok"
    for status in ("incorrect", "runtime_error", "compile_error"):
        recs = _canned()
        bad = next(r for r in recs if r.get("kind") == "cell" and (r.get("step") == tag if tag else r.get("lengths")))
        bad.update(status=status, reason="what broke")
        s = RENDERERS[sid](recs, cfg, None)
        assert s.status == "failed" and f"cell(s) failed; first: {bad['backend']}" in s.reason, (sid, s.reason)
        assert s.reason.endswith(f"{status}: what broke")


def test_each_step_is_one_module_registered_once():
    """Issue 24 item 4: a step's title, plan, probe and renderer are one module of attnlab.lab.steps,
    whose ``STEP`` is listed once; the section it renders carries that title."""
    import importlib
    import pkgutil

    from attnlab.lab import STEPS, steps
    from attnlab.lab.step_types import LabConfig
    from attnlab.lab.render import RENDERERS

    modules = [importlib.import_module(f"attnlab.lab.steps.{m.name}") for m in pkgutil.iter_modules(steps.__path__)]
    registered = {m.__name__.rsplit(".", 1)[1]: m.STEP for m in modules if hasattr(m, "STEP")}
    assert sorted(registered) == sorted(MODULES), "a step module missing from attnlab.lab.steps.MODULES (or listed twice)"
    assert len(STEPS) == len(MODULES) and list(RENDERERS) == STEP_IDS
    for number, name in enumerate(MODULES, start=1):   # numbers come from the registry's order, not the titles
        assert STEPS[registered[name].id].title == f"{number}. {registered[name].title}", name
        assert not registered[name].title[:1].isdigit(), f"{name}: a step's own title has no number"
    cfg = LabConfig.for_machine(True, False)
    for sid, step in STEPS.items():
        assert step.render([], cfg, None).title.startswith(step.title), sid
        if step.sweeps:
            assert step.cells_note(cfg).startswith("Cells: "), sid


def test_importing_the_lab_imports_no_jax():
    code = ("import sys, attnlab, attnlab.lab, attnlab.lab.render, attnlab.lab.steps, attnlab.lab.step_types, attnlab.lab.plots; "
            "assert 'jax' not in sys.modules; attnlab.attention; assert 'jax' in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_measuring_steps_declare_sweeps():
    from attnlab.lab import STEPS
    from attnlab.lab.step_types import LabConfig
    from attnlab.sweep.spec import Sweep

    cfg = LabConfig.for_machine(True, False)
    for sid in ("timing", "sweeps", "gqa", "next", "decode"):
        sweeps = STEPS[sid].sweeps(cfg)
        assert sweeps and all(isinstance(s, Sweep) for s in sweeps), sid
    names = {s.name for s in STEPS["sweeps"].sweeps(cfg)}
    assert names == {"seq_sweep", "batch_sweep"}
    assert [(c.backend, c.dtype) for s in STEPS["timing"].sweeps(cfg) for c in s.cells()] == [
        ("naive", "float32"), ("xla", "float32")]


def test_run_lab_resumes_after_a_kill(tmp_path, monkeypatch):
    """Killed after 3 cells (Ctrl-C in the engine), re-run with resume=True: only the missing cells are measured."""
    from attnlab.lab import run_lab
    from attnlab.lab.step_types import LabConfig
    from attnlab.sweep import engine

    cfg = LabConfig(batch=2, q_len=16, heads=2, head_dim=8, quick=True, gpu=False)
    real = engine.measure_cell
    measured = []

    def killed_after(n):
        def measure(cell, options=None, **kw):
            if n is not None and len(measured) >= n:
                raise KeyboardInterrupt
            measured.append(cell.key())
            return real(cell, options, **kw)
        return measure

    monkeypatch.setattr(engine, "measure_cell", killed_after(3))
    with pytest.raises(KeyboardInterrupt):
        run_lab(str(tmp_path), sections=["timing", "sweeps"], config=cfg)
    first = list(measured)
    assert len(first) == 3
    with pytest.raises(ValueError, match="--resume"):       # a folder with results: resume or overwrite
        run_lab(str(tmp_path), sections=["timing", "sweeps"], config=cfg)
    measured.clear()
    monkeypatch.setattr(engine, "measure_cell", killed_after(None))
    secs = run_lab(str(tmp_path), sections=["timing", "sweeps"], config=cfg, resume=True)
    assert [s.status for s in secs] == ["ok", "ok"], [(s.id, s.reason) for s in secs]
    assert measured and not set(first) & set(measured)          # nothing measured twice
    assert len(set(measured)) == len(measured)
    recs = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    cells = [r for r in recs if r["kind"] == "cell"]
    assert [r["step"] for r in cells] == ["timing"] * 2 + ["seq_sweep"] * 4 + ["batch_sweep"] * 4
    assert len({json.dumps([r[k] for k in ("backend", "batch", "q_len", "dtype")]) for r in cells}) == len(first) + len(measured)
    # the timing step's cells reappear in the batch sweep (B=2, T=16), measured once
    again = [r for r in cells if r["step"] == "batch_sweep" and r["batch"] == 2]
    assert again and all(r.get("same_as") == "timing" for r in again)
    # a fresh run (no resume) measures everything again
    measured.clear()
    run_lab(str(tmp_path), sections=["timing"], config=cfg, overwrite=True)
    assert len(measured) == 2


def test_cli_run_resume_measures_nothing_already_measured(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from attnlab.cli import main
    from attnlab.sweep import engine

    out = str(tmp_path / "o")
    r = CliRunner().invoke(main, ["run", "--out", out, "--quick", "--sections", "timing"])
    assert r.exit_code == 0, r.output
    calls = []
    real = engine.measure_cell
    monkeypatch.setattr(engine, "measure_cell", lambda cell, options=None, **kw: calls.append(cell) or real(cell, options, **kw))
    r = CliRunner().invoke(main, ["run", "--out", out, "--quick", "--sections", "timing", "--resume"])
    assert r.exit_code == 0, r.output
    assert calls == []
    steps = [json.loads(line) for line in open(os.path.join(out, "results.jsonl"))]
    assert [x["step"] for x in steps if x["kind"] == "lab_step"] == ["timing"]
    assert sum(x["kind"] == "cell" for x in steps) == 2


def _fp8_cell(step, backend, T, err, ms, inputs="gaussian", status="ok"):
    return {"kind": "cell", "step": step, "backend": backend, "inputs": inputs, "batch": 1, "q_len": T, "kv_len": T,
            "heads": 16, "kv_heads": 16, "head_dim": 128, "dtype": "bfloat16", "causal": True, "window": None,
            "mode": "fwd", "status": status, "reason": None if status == "ok" else "output wrong", "timer": "cupti",
            "kernel_ms": ms if status == "ok" else None, "rel_err": err, "rel_err_f64": err,
            "kernel_p25_ms": ms, "kernel_p75_ms": ms}


def test_step10_shows_the_best_fp8_recipe_and_its_cost():
    """Canned H200-like records: the recipe table, the best recipe per inputs (rule: lowest error within
    5% of the fastest FP8 recipe) and its cost against bf16 cuDNN; without recipe records it still renders."""
    from attnlab.lab.step_types import LabConfig
    from attnlab.lab.steps.te_fp8 import best_fp8_recipe
    from attnlab.lab.steps.te_fp8 import render as render_te_fp8

    probe = {"kind": "lab_step", "step": "te_fp8", "status": "ok", "probe": {
        "te_why": "TransformerEngine is not installed", "fp8_why": {"te-fp8": "TransformerEngine is not installed",
                                                                    "cudnn-fp8": None},
        "recipes_why": {"cudnn-fp8": None, "cudnn-fp8-hadamard": None, "cudnn-fp8-smoothk": None}}}
    recs = [probe] + [_fp8_cell("fp8", b, T, e, ms) for T in (1024, 4096)
                      for b, e, ms in (("cudnn-fp8", 0.055, 0.1 * T / 1024), ("cudnn", 0.0025, 0.13 * T / 1024))]
    recs += [_fp8_cell("fp8-recipes", b, 4096, e, ms, inputs=d) for b, d, e, ms in (
        ("cudnn-fp8", "gaussian", 0.055, 0.40), ("cudnn-fp8-hadamard", "gaussian", 0.054, 0.41),
        ("cudnn-fp8-smoothk", "gaussian", 0.050, 0.45), ("cudnn", "gaussian", 0.0025, 0.52),
        ("cudnn-fp8-hadamard", "channel-outliers", 0.09, 0.41), ("cudnn", "channel-outliers", 0.03, 0.52))]
    recs.insert(-2, _fp8_cell("fp8-recipes", "cudnn-fp8", 4096, 0.36, None, inputs="channel-outliers", status="incorrect"))
    s = render_te_fp8(recs, LabConfig.for_machine(False, True), None)
    t = next(t for t in s.tables if t.title.startswith("FP8 recipes vs bf16 cuDNN (T=S=4096"))
    assert t.columns == ["backend", "inputs = gaussian", "inputs = channel-outliers"]
    assert t.rows[0] == ["cudnn-fp8", "5.50% · 0.4 ms", "36.00% · incorrect"]
    text = " ".join(s.paragraphs)
    assert "Best FP8 recipe on gaussian inputs (lowest error among the recipes within 5% of the fastest): " \
           "cudnn-fp8-hadamard, 5.40% at 0.41 ms; bf16 cuDNN: 0.25% at 0.52 ms, so FP8 is 1.27x as fast at 21.6x the error" in text
    assert "Best FP8 recipe on channel-outliers inputs" in text and "cudnn-fp8-hadamard, 9.00%" in text
    assert best_fp8_recipe([r for r in recs if r["step"] == "fp8-recipes" and r["inputs"] == "gaussian"])["backend"] \
        == "cudnn-fp8-hadamard"   # smoothk has less error but is 12% slower than the fastest
    # no recipe timed on some inputs (all over the FP8 limit): the lowest error and its gain are still said
    untimed = [r for r in recs if not (r.get("inputs") == "channel-outliers" and r["backend"] == "cudnn-fp8-hadamard")]
    untimed.append(_fp8_cell("fp8-recipes", "cudnn-fp8-hadamard", 4096, 0.12, None, inputs="channel-outliers",
                             status="incorrect"))
    text = " ".join(render_te_fp8(untimed, LabConfig.for_machine(False, True), None).paragraphs)
    assert "On channel-outliers inputs no FP8 recipe was timed (each over the FP8 limit); lowest error " \
           "cudnn-fp8-hadamard 12.00% against per-tensor amax's 36.00% (3.0x lower)." in text
    # a CPU probe: every recipe unavailable, said in one line; no records at all still renders
    cpu = dict(probe, probe={**probe["probe"], "recipes_why": {"cudnn-fp8": "needs an NVIDIA GPU", "cudnn-fp8-pow2": "needs an NVIDIA GPU"}})
    s = render_te_fp8([cpu], LabConfig.for_machine(True, False), None)
    assert any(p.startswith("FP8 recipes (cudnn-fp8, cudnn-fp8-pow2): skipped — needs an NVIDIA GPU") for p in s.paragraphs)


def _decode_rec(backend, T, ms, N=32, K=8, lengths="full", page_size=None, status="ok"):
    return {"backend": backend, "batch": 8, "q_len": T, "kv_len": 32768, "heads": N, "kv_heads": K, "head_dim": 128,
            "dtype": "bfloat16", "causal": True, "lengths": lengths, "page_size": page_size, "status": status,
            "reason": None if status == "ok" else "pages refused here", "kernel_ms": ms if status == "ok" else None,
            "timer": "cupti", "gbps": 4000.0, "pct_roofline": 90.0, "roofline_ms": 0.22}


def test_the_decode_step_shows_group_size_and_paging():
    """Issue 25: G = 7 beside G = 4, and paged caches against their contiguous twin, in their own table;
    the main race keeps the contiguous G = 4 cells only."""
    from attnlab.lab.step_types import LabConfig
    from attnlab.lab.steps.decode import render_decode

    recs = [_decode_rec("attnlab-decode", 1, 0.26, lengths="paged", page_size=16),       # any order
            _decode_rec("attnlab-decode", 1, 0.13, N=28, K=4), _decode_rec("attnlab-decode", 16, 0.19, N=28, K=4),
            _decode_rec("attnlab-decode", 1, 0.25), _decode_rec("attnlab-decode", 16, 0.26), _decode_rec("cudnn", 1, 0.24),
            _decode_rec("attnlab-decode", 1, 0.2525, lengths="paged", page_size=64),
            _decode_rec("attnlab-decode", 16, None, lengths="paged", page_size=64, status="unsupported")]
    sec = render_decode(recs, LabConfig.for_machine(False, True))
    main, layouts = sec.tables
    assert main.rows[0][:2] == [1, "0.25 ms · 4000 GB/s · 90% roof"]     # contiguous G = 4, not a paged or G = 7 cell
    rows = {(r[0], r[1]): r for r in layouts.rows}
    assert layouts.columns == ["group", "KV cache", "T=1", "T=16", "paged / contiguous"]
    assert set(rows) == {("G = 4 (32/8)", "contiguous"), ("G = 7 (28/4)", "contiguous"), ("G = 4 (32/8)", "paged 16"),
                         ("G = 4 (32/8)", "paged 64")}
    assert rows[("G = 4 (32/8)", "paged 16")][-1] == "1.040× (T=1)"
    assert rows[("G = 4 (32/8)", "paged 64")][-1] == "1.010× (T=1)"
    assert rows[("G = 4 (32/8)", "paged 64")][3].startswith("unsupported: pages refused")
    assert rows[("G = 7 (28/4)", "contiguous")][2:4] == ["0.13 ms · 90% roof", "0.19 ms · 90% roof"]
    assert sec.facts["cells"] == 8


def test_the_decode_step_shows_a_ragged_serving_batch_beside_the_uniform_one():
    from attnlab.lab.step_types import LabConfig
    from attnlab.lab.steps.decode import render_decode, sweeps_decode

    uniform = dict(_decode_rec("attnlab-decode", 1, 0.25, lengths="uniform"), tokens_per_s=32000.0,
                   request_lengths={"kv_total": 8 * 32768})
    skewed = dict(_decode_rec("attnlab-decode", 1, 0.1, lengths="one-long"), pct_roofline=29.0, tokens_per_s=80000.0,
                  request_lengths={"kv_total": 32768 + 7 * 1024})
    sec = render_decode([skewed, _decode_rec("attnlab-decode", 1, 0.24), uniform], LabConfig.for_machine(False, True))
    main, serving = sec.tables              # the serving records are not in the main race nor in a layout table
    assert [r[:4] for r in serving.rows] == [["decode_attention, every sequence full", 262144, "0.24 ms", "90%"],
                                             ["serving_attention, uniform", 262144, "0.25 ms", "90%"],
                                             ["serving_attention, one-long", 39936, "0.1 ms", "29%"]]
    assert serving.rows[2][4] == "8e+04" and len(main.rows) == 1 and sec.facts["cells"] == 3   # serving cells count
    cells = [c for s in sweeps_decode(LabConfig.for_machine(False, True)) for c in s.cells() if c.lengths != "full"]
    assert {(c.lengths, c.backend, c.q_len) for c in cells if not c.page_size} == {
        ("uniform", "attnlab-decode", 1), ("one-long", "attnlab-decode", 1)}


def _timing_gpu_rec(backend, kernel, wall):
    return {"kind": "cell", "step": "timing", "backend": backend, "dtype": "bfloat16", "status": "ok", "reason": None,
            "timer": "cupti", "kernel_ms": kernel, "kernel_p25_ms": kernel * 0.95, "kernel_p75_ms": kernel * 1.05,
            "wall_ms": wall, "wall_p25_ms": wall * 0.9, "wall_p75_ms": wall * 1.1, "pipelined_ms": wall * 0.8,
            "dispatch_ms": wall - kernel, "compile_s": 1.25}


def test_each_column_shows_the_record_field_its_header_names():
    """A column headed by a key of FIELD_COLUMNS shows that field of its row's record: "rel L2 vs float64"
    is rel_err_f64 (sampled rows against NumPy float64), never rel_err (the float32 device reference)."""
    from attnlab.lab.step_types import LabConfig
    from attnlab.lab.render import render_all
    from attnlab.lab.render_common import FIELD_COLUMNS, fmt
    from attnlab.lab.steps.te_fp8 import render as render_te_fp8
    from attnlab.lab.steps.timing import render as render_timing

    for header, (field, _) in FIELD_COLUMNS.items():      # the header names its field
        if "rel L2" in header:
            assert ("float64" in header) == field.endswith("_f64"), header
    gpu = LabConfig.for_machine(False, True)
    fp8 = [{"kind": "lab_step", "step": "te_fp8", "status": "ok", "probe": {
        "te_why": "TransformerEngine is not installed", "fp8_why": {"te-fp8": "not installed", "cudnn-fp8": None},
        "recipes_why": {"cudnn-fp8": "not installed"}}}]
    fp8 += [dict(_fp8_cell("fp8", b, 4096, e, 0.4), rel_err_f64=e * 1.5) for b, e in (("cudnn-fp8", 0.05), ("cudnn", 0.002))]
    sections = render_all(_canned(), LabConfig.for_machine(True, False)) + [
        render_te_fp8(fp8, gpu), render_timing([_timing_gpu_rec("xla", 0.2, 0.5), _timing_gpu_rec("cudnn", 0.1, 0.4)], gpu)]
    checked = set()
    for t in (t for s in sections for t in s.tables):
        shown = [c for c in t.columns if c in FIELD_COLUMNS]
        if not shown or not t.sources:
            continue
        assert len(t.sources) == len(t.rows), t.title
        for col in shown:
            field, spec = FIELD_COLUMNS[col]
            i = t.columns.index(col)
            for row, rec in zip(t.rows, t.sources):
                if rec is not None:
                    assert row[i] == fmt(rec.get(field), spec), (t.title, col, row[i], rec.get(field))
                    checked.add(col)
    assert checked >= {"rel L2 vs float64", "FP8 rel L2 vs float64", "kernel (CUPTI)", "wall per blocked call",
                       "dispatch = wall − kernel"}
    gqa = next(t for s in sections for t in s.tables if t.title.startswith("Query heads N="))
    assert gqa.sources and "rel L2 vs float64" in gqa.columns    # the step 9 table is one of those checked


def test_cpu_sections_say_what_ran_here():
    """On a CPU: step 7's table is wall time only (its title says why), step 11 calls a path faster than
    XLA only where the repeats' spreads do not overlap, step 12 names the CPU programs, not GPU kernels."""
    from attnlab.lab.step_types import LabConfig
    from attnlab.lab.render import render_all
    from attnlab.lab.render_common import speedup_text

    secs = {s.id: s for s in render_all(_canned(), LabConfig.for_machine(True, False))}
    (timing,) = secs["timing"].tables
    assert timing.title.startswith("Wall time per call, no kernel time") and not any("kernel" in c for c in timing.columns)
    speed = next(t for t in secs["next"].tables if t.title.startswith("Speed-up over XLA"))
    assert speed.columns == ["T = S", "xla", "naive", "naive vs xla"]
    assert all("[" in r[1] and "[" in r[2] for r in speed.rows)          # each time with its spread
    assert all(r[3].endswith("no clear difference (spreads overlap)") for r in speed.rows)   # canned: they overlap
    fast = {"status": "ok", "wall_ms": 1.0, "wall_p25_ms": 0.9, "wall_p75_ms": 1.1}
    slow = {"status": "ok", "wall_ms": 2.58, "wall_p25_ms": 2.4, "wall_p75_ms": 2.7}
    noisy = {"status": "ok", "wall_ms": 2.58, "wall_p25_ms": 0.95, "wall_p75_ms": 6.0}
    assert speedup_text(fast, slow) == "2.58× faster" and speedup_text(slow, fast) == "0.39× (slower)"
    assert speedup_text(fast, noisy) == "2.58×: no clear difference (spreads overlap)"
    text = " ".join(secs["decode"].paragraphs)
    assert "interpret mode" in text and "jax.nn's XLA attention compiled for the CPU" in text
    for gpu_word in ("GPU's ridge", "split-KV", "fall off", "flash-decoding", "registers"):
        assert gpu_word not in text, gpu_word


def test_the_roofline_draws_its_roof_and_labels_several_ticks(monkeypatch):
    """A CPU's roofline: the measured roof drawn and labelled, and plain-number labels at 1-2-5 of each
    decade (a range within one decade still gets several), not two scientific labels."""
    from attnlab.lab import plots

    figs = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figs.append(fig) or path)
    recs = [{"backend": b, "status": "ok", "wall_ms": 1.0, "intensity": x, "tflops": t, "step": "seq_sweep"}
            for b, pts in (("naive", ((8, 0.029), (16, 0.051), (64, 0.032))), ("xla", ((8, 0.026), (32, 0.068))))
            for x, t in pts]
    plots.roofline(recs, "r.png", measured=(0.1, 0.012), title="roofline (cpu)")
    ax = figs[-1].axes[0]
    figs[-1].canvas.draw()
    assert any(x.startswith("measured roof: 100 GFLOP/s, 12 GB/s") for x in ax.get_legend_handles_labels()[1])
    lo, hi = ax.get_ylim()
    shown = [t.get_text() for t in ax.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi]
    assert len(shown) >= 3 and all("^" not in x and "times" not in x for x in shown), shown
    assert hi >= 100      # the roof is inside the plot


def test_gqa_says_each_variant_against_mha():
    """Step 9 judges each GQA/MQA variant apart on the repeats' spread: one slower and one faster is said so."""
    from attnlab.lab.steps.gqa import explanation

    def rec(K, ms, lo, hi):
        return {"backend": "xla", "status": "ok", "heads": 8, "kv_heads": K, "wall_ms": ms, "wall_p25_ms": lo, "wall_p75_ms": hi}

    text = explanation([rec(8, 9.67, 6.0, 25.0), rec(2, 40.0, 30.0, 50.0), rec(1, 1.58, 1.5, 1.6)], None)
    assert "slower at K=2, faster at K=1" in text and "(K=8)" in text
    assert explanation([rec(8, 9.67, 6.0, 25.0), rec(2, 20.1, 16.0, 32.0)], None) is None   # spreads overlap


def test_the_decode_step_shows_a_window_sinks_and_an_fp8_cache_beside_the_plain_call():
    from attnlab.lab.step_types import LabConfig
    from attnlab.lab.steps.decode import render_decode, sweeps_decode

    plain = dict(_decode_rec("attnlab-decode", 1, 0.25), rel_err_f64=2e-3)
    window = dict(_decode_rec("attnlab-decode", 1, 0.01), window=[128, 0], rel_err_f64=3e-3, pct_roofline=60.0)
    sinks = dict(_decode_rec("attnlab-decode", 1, 0.255), sinks=True, rel_err_f64=2e-3)
    fp8 = dict(_decode_rec("attnlab-decode", 1, 0.135), kv_dtype="float8_e4m3fn", kv_scale="token", rel_err_f64=1e-3,
               kv_rel_err=0.031)
    sec = render_decode([fp8, window, plain, sinks], LabConfig.for_machine(False, True))
    main, feats = sec.tables                  # the feature records are not in the main race nor in a layout table
    assert len(main.rows) == 1 and main.rows[0][1].startswith("0.25 ms")
    assert [r[1].split(" ")[0] for r in feats.rows] == ["plain:", "sliding", "attention", "float8_e4m3fn"]
    assert feats.rows[1][2:7] == ["0.01 ms", "60%", "0.040×", "3.00e-03", ""]
    assert feats.rows[3][4:] == ["0.540×", "1.00e-03", "3.10e-02"]
    assert feats.sources == [plain, window, sinks, fp8] and sec.facts["cells"] == 4
    cells = [c for s in sweeps_decode(LabConfig.for_machine(False, True)) for c in s.cells()
             if c.window or c.sinks or c.kv_dtype]
    assert {(c.window, c.sinks, c.kv_dtype, c.q_len, c.lengths) for c in cells} == {
        ((128, 0), False, None, 1, "full"), (None, True, None, 1, "full"), (None, False, "float8_e4m3fn", 1, "full")}
    assert not [c for s in sweeps_decode(LabConfig.for_machine(True, True)) for c in s.cells() if c.sinks]  # quick
