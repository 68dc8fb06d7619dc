"""``bench --model`` and ``attnlab advise`` (issue 16, items 2-3): the phase plan, the advice from
canned records (no JAX), the flag checks, and the commands end to end on the CPU at a tiny context."""
import json

import pytest
from click.testing import CliRunner

from attnlab.report.advice import advise, tables
from attnlab.core.model_plan import PlanError, notes, parse_contexts, plan
from attnlab.core.models import PRESETS, preset


def test_contexts_accept_k_and_ints_and_name_a_bad_one():
    assert parse_contexts("4k,32k,128k") == [4096, 32768, 131072]
    assert parse_contexts("256, 1024,4K") == [256, 1024, 4096]
    with pytest.raises(PlanError, match="'4x' is not a token count"):
        parse_contexts("4x")
    with pytest.raises(PlanError, match="phase: 'infer'"):
        plan(preset("llama-3.1-8b"), "infer", "4k")


def test_phases_are_the_cells_the_issue_names():
    es = plan(preset("llama-3.1-70b"), "prefill,decode,train", "32k", 2)
    got = [(e.phase, e.q_len, e.kv_len, e.mode, e.lengths, e.window, e.layers) for e in es]
    assert got == [("prefill", 32768, 32768, "fwd", None, None, 80),
                   ("decode", 1, 32768, "fwd", "full", None, 80), ("decode", 4, 32768, "fwd", "full", None, 80),
                   ("train", 32768, 32768, "fwd+bwd", None, None, 80)]
    assert all((e.batch, e.heads, e.kv_heads, e.head_dim, e.dtype) == (2, 64, 8, 128, "bfloat16") for e in es)


def test_windows_every_layer_and_gemma_alternate_layers():
    phi = plan(preset("phi-3-mini"), "prefill,decode", "4k")
    assert phi[0].window == (2047, 0) and phi[0].kind == "windowed" and phi[0].layers == 32
    assert [(e.q_len, e.kv_len) for e in phi[1:]] == [(1, 2048), (4, 2051)]   # rolling buffer W + T
    g = plan(preset("gemma-2-27b"), "prefill", "8k")
    assert [(e.kind, e.layers, e.window) for e in g] == [("windowed", 23, (4096, 0)), ("global", 23, None)]
    # a window that covers the context is global attention: measured once, with every layer
    assert [(e.kind, e.layers) for e in plan(preset("gemma-2-9b"), "prefill", "1k")] == [("global", 42)]
    text = " ".join(notes(preset("gemma-2-9b"), "8k"))
    assert "soft-cap 50 measured" in text and "NOT modelled" not in text and "21 windowed and 21 global" in text


def test_presets_have_params_and_windowed_kv_bytes():
    assert all(p.params for p in PRESETS)
    m = preset("mistral-7b")
    assert m.kv_cache_bytes(32768) == 2 * 32 * 32768 * 8 * 128 * 2
    assert m.kv_cache_bytes(32768, windowed=True) == 2 * 32 * 4097 * 8 * 128 * 2
    g = preset("gemma-2-9b")
    assert g.kv_cache_bytes(8192, windowed=True) == 2 * 8 * 256 * 2 * (21 * 4097 + 21 * 8192)


def _rec(e, backend, status, ms):
    return {"backend": backend, "batch": e.batch, "q_len": e.q_len, "kv_len": e.kv_len, "heads": e.heads,
            "kv_heads": e.kv_heads, "head_dim": e.head_dim, "dtype": e.dtype, "causal": True,
            "window": list(e.window) if e.window else None, "mode": e.mode, "lengths": e.lengths, "devices": 1,
            "strategy": None, "soft_cap": e.soft_cap, "status": status, "kernel_ms": ms if status in ("ok", "unchecked") else None,
            "wall_ms": None, "reason": None if status == "ok" else "why"}


def test_advice_picks_the_fastest_correct_and_weights_layer_kinds():
    p = preset("gemma-2-9b")
    es = plan(p, "prefill,decode", "8k")
    recs = []
    for e in es:
        base = 1.0 if e.kind == "global" else 0.5
        recs += [_rec(e, "a", "ok", 2 * base), _rec(e, "b", "ok", base), _rec(e, "fast-wrong", "incorrect", None),
                 _rec(e, "fast-unchecked", "unchecked", base / 10)]
    adv = advise(p, es, recs, batch=1, device_bytes=141 * 10**9, device_kind="NVIDIA H200")
    assert all(c["best"] == "b" for c in adv["cells"])          # never incorrect or unchecked
    # a PyTorch peer may be the fastest correct backend: the fastest JAX path is named beside it
    adv2 = advise(p, es, recs + [_rec(e, "torch-x", "ok", 0.01) for e in es], non_jax={"torch-x"})
    c = adv2["cells"][0]
    assert c["best"] == "torch-x" and c["best_native"] and c["best_jax"] == "b"
    assert any(r[-1].startswith("torch-x (PyTorch; JAX: b ") for t in tables(adv2) for r in t["rows"] if t["rows"])
    pre = next(r for r in adv["phases"] if r["phase"] == "prefill")
    assert pre["model_ms"] == pytest.approx(21 * 0.5 + 21 * 1.0) and pre["per_token_ms"] is None
    d4 = next(r for r in adv["phases"] if r["phase"] == "decode" and r["q_len"] == 4)
    assert d4["per_token_ms"] == pytest.approx(d4["model_ms"] / 4)
    m = adv["memory"][0]
    assert m["weights_bytes"] == int(9.24e9) * 2
    assert m["max_batch"] == (141 * 10**9 - m["weights_bytes"]) // m["kv_bytes_per_seq"]
    summary, side, memory = tables(adv)
    assert "fast-wrong" in side["columns"] and "incorrect (1)" in side["rows"][0]   # its reason under the table
    assert side["footnotes"] == ["(1) fast-wrong: why", "(2) fast-unchecked: why"]
    json.dumps(adv)


def test_advice_says_when_nothing_is_correct_and_when_weights_do_not_fit():
    p = preset("llama-3.1-405b")
    es = plan(p, "prefill", "4k")
    adv = advise(p, es, [_rec(es[0], "x", "unsupported", None)], device_bytes=141 * 10**9)
    assert adv["cells"][0]["best"] is None and adv["phases"][0]["model_ms"] is None
    assert adv["memory"][0]["max_batch"] == 0 and any("exceed" in n for n in adv["notes"])
    assert "none correct" in tables(adv)[0]["rows"][0][2]


def test_bench_model_refuses_contradicting_flags():
    from attnlab.cli import main

    for args, msg in ((["--heads", "8"], "--heads 8 contradicts --model llama-3.1-8b (heads = 32)"),
                      (["--seq", "64"], "--seq contradicts --model"), (["--inputs", "outliers"], "measured on gaussian inputs"), (["--context", "4q"], "'4q' is not a token count"),
                      (["--batch", "1,2"], "one value with --model"),
                      (["--fp8-recipe", "hadamard"], "--fp8-recipe contradicts --model")):   # it was dropped
        r = CliRunner().invoke(main, ["bench", "--model", "llama-3.1-8b", *args], terminal_width=200)
        assert r.exit_code == 2 and msg in r.output, r.output
    r = CliRunner().invoke(main, ["bench", "--context", "4k", "--backends", "naive"])
    assert r.exit_code == 2 and "need --model" in r.output
    # flags that agree with the preset are fine (checked before anything runs: a bad backend stops it)
    r = CliRunner().invoke(main, ["bench", "--model", "llama-3.1-8b", "--heads", "32", "--backends", "nope"])
    assert "unknown backend 'nope'" in r.output


def test_bench_model_runs_decode_cells_on_cpu(tmp_path):
    from attnlab.cli import main
    from attnlab.core.store import read_records

    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["bench", "--model", "phi-3-mini", "--phase", "decode", "--context", "64",
                                  "--backends", "naive", "--repeats", "1", "--min-time", "0", "--out", str(out)],
                           terminal_width=250)
    assert r.exit_code == 0, r.output
    recs = read_records(str(out / "results.jsonl"))
    assert [(x["q_len"], x["kv_len"], x["lengths"], x["heads"], x["head_dim"], x["status"]) for x in recs] == [
        (1, 64, "full", 32, 96, "ok"), (4, 64, "full", 32, 96, "ok")]


def test_bench_model_measures_decode_cells_on_a_quantized_cache(tmp_path):
    """--kv-dtype with --model: the decode cells read that cache (with the model's sinks), prefill reads none;
    each record is its plan entry's (what advise reads); more than one value, or page scales, is refused."""
    from attnlab.cli import main
    from attnlab.core.store import read_records

    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["bench", "--model", "gpt-oss-20b", "--phase", "decode", "--context", "64",
                                  "--kv-dtype", "fp8", "--backends", "xla", "--repeats", "1", "--min-time", "0",
                                  "--out", str(out)], terminal_width=250)
    assert r.exit_code == 0, r.output
    assert "decode cells read a float8_e4m3fn KV cache" in r.output
    recs = read_records(str(out / "results.jsonl"))
    assert [(x["q_len"], x["kv_dtype"], x["kv_scale"], x["sinks"], x["status"]) for x in recs] == [
        (1, "float8_e4m3fn", "token", True, "ok"), (4, "float8_e4m3fn", "token", True, "ok")]
    assert all(0 < x["rel_err"] < 5e-3 < x["kv_rel_err"] for x in recs)
    entries = plan(preset("gpt-oss-20b"), "prefill,decode", "64", kv_cache=("float8_e4m3fn", "token"))
    assert [e.kv_cache for e in entries] == [None, ("float8_e4m3fn", "token"), ("float8_e4m3fn", "token")]
    assert [sum(e.matches(x) for x in recs) for e in entries] == [0, 1, 1]
    for kv in ("fp8,int8", "fp8:page"):
        r = CliRunner().invoke(main, ["bench", "--model", "gpt-oss-20b", "--kv-dtype", kv], terminal_width=200)
        assert r.exit_code == 2 and "--kv-dtype: one value with --model" in r.output, r.output


def test_advise_end_to_end_on_cpu(tmp_path):
    from attnlab.cli import main

    out = tmp_path / "adv"
    args = ["advise", "--model", "llama-3.1-8b", "--context", "64", "--batch", "1", "--backends", "naive,xla,cudnn",
            "--phase", "prefill,decode", "--repeats", "2", "--out", str(out)]
    r = CliRunner().invoke(main, args, terminal_width=250)
    assert r.exit_code == 0, r.output
    adv = json.loads((out / "advise.json").read_text())
    assert [(x["phase"], x["q_len"]) for x in adv["phases"]] == [("prefill", 64), ("decode", 1), ("decode", 4)]
    assert all(x["model_ms"] and x["per_layer"]["global"]["best"] in ("naive", "xla") for x in adv["phases"])
    assert adv["memory"][0]["kv_bytes_per_seq"] == 2 * 32 * 64 * 8 * 128 * 2
    html = (out / "advise.html").read_text()
    assert "llama-3.1-8b" in html and "fastest correct" in html and "activations" in html
    assert "fastest correct path per phase" in r.output
    # cudnn (no GPU here) is not timed: its status and footnote in the table, the reason under it, here and in HTML
    note = "(1) cudnn: needs an NVIDIA GPU"
    assert "unsupported (1)" in r.output and r.output.index("unsupported (1)") < r.output.index(note)
    side = html[html.index("<figcaption>one layer, every backend"):]
    assert "unsupported (1)" in side and side.index("</table>") < side.index(note) < side.index("KV cache and")
    r2 = CliRunner().invoke(main, args, terminal_width=250)          # resumes: nothing measured again
    assert r2.exit_code == 0 and r2.output.count("  resumed") == 9, r2.output
    assert r2.output.rstrip().endswith(f"0 cells measured, 9 resumed from {out}/results.jsonl"), r2.output


def test_model_sweep_is_one_cell_per_entry_and_backend():
    from attnlab.sweep.model_cells import NOT_BY_DEFAULT, default_backends, model_sweep

    assert not set(default_backends()) & set(NOT_BY_DEFAULT) and "naive" in default_backends()
    ms = model_sweep(preset("gemma-2-9b"), "prefill,decode,train", "8k", 1, ["naive", "xla"])
    assert len(ms.entries) == 2 + 4 + 2 and len(ms.cells()) == 2 * len(ms.entries)
    assert {c.window for c in ms.cells() if c.mode == "fwd+bwd"} == {(4096, 0), None}
    assert all(c.lengths == "full" and c.window is None for c in ms.cells() if c.q_len in (1, 4))
