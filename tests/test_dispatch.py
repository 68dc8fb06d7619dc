"""Measured auto (issue 16, item 4): shape buckets, the dispatch table, auto's use of it, ``attnlab tune``.

conftest points ATTNLAB_CACHE_DIR at an empty temp dir, so no test sees a user's table; these tests
write theirs through ATTNLAB_DISPATCH=/path.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attnlab
import attnlab.reference.inputs
from attnlab import backends
from attnlab.api import dispatch
from attnlab.api.dot_product import running_version
from attnlab.core.problem import Problem
from attnlab.reference.float64 import reference_attention

SRC = str(Path(__file__).resolve().parents[1] / "src")
P = Problem(2, 48, 48, 4, 2, 16, "float32", causal=True)


def _qkv(p: Problem = P, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((p.batch, p.q_len, p.heads, p.head_dim)).astype(p.dtype)
    k = rng.standard_normal((p.batch, p.kv_len, p.kv_heads, p.head_dim)).astype(p.dtype)
    v = rng.standard_normal((p.batch, p.kv_len, p.kv_heads, p.head_dim)).astype(p.dtype)
    return q, k, v


def _entry(backend="naive", key=None, mode="fwd", **over):
    e = {"device_kind": attnlab.core.device.current().kind,
         "versions": {n: running_version(n) for n in dispatch.BASE_VERSIONS},
         "bucket": key or dispatch.bucket(P, mode), "backend": backend, "ms": 1.0,
         "runner_up": [{"backend": "xla", "ms": 2.0}], "cells": 1, "date": "2026-12-03"}
    e.update(over)
    return e


@pytest.fixture
def table(tmp_path, monkeypatch):
    """Write entries to a table that auto reads (ATTNLAB_DISPATCH=path); returns the writer."""
    path = tmp_path / "dispatch.json"
    monkeypatch.setenv(dispatch.ENV_VAR, str(path))

    def write(*entries):
        dispatch.save(entries, str(path))
        return path
    return write


# --- buckets ---------------------------------------------------------------------------------

def test_bucket_is_stable_and_jax_free():
    code = ("import sys; from attnlab.api import dispatch; from attnlab.core.problem import Problem; "
            "print(dispatch.bucket(Problem(2, 3072, 3072, 16, 4, 128, 'bfloat16', causal=True), 'fwd+bwd')); "
            "print('jax' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=SRC))
    assert r.returncode == 0, r.stderr
    key, has_jax = r.stdout.split("\n")[:2]
    assert key == "bfloat16 causal win:none train H128 gqa T4096 S4096 BN32 dense"
    assert has_jax == "False"


def test_bucket_rounds_up_to_powers_of_two_and_reads_every_kind_of_object():
    from attnlab.measure import Cell
    from attnlab.core.prepare import prepare

    b = dispatch.bucket
    assert b(Problem(1, 3072, 3072, 8, 8, 64)) == b(Problem(1, 4096, 4096, 8, 8, 64))
    assert b(Problem(1, 4097, 4097, 8, 8, 64)) != b(Problem(1, 4096, 4096, 8, 8, 64))
    assert b(Problem(2, 1024, 1024, 16, 16, 64)) == b(Problem(4, 1024, 1024, 8, 8, 64))    # B*N = 32
    assert b(Problem(1, 64, 64, 8, 8, 64)) != b(Problem(1, 64, 64, 8, 8, 128))              # H exactly
    assert b(Problem(1, 64, 64, 8, 1, 64)).split()[5] == "mqa"
    assert b(P) != b(P, "fwd+bwd") and b(P, "fwd+bwd") == b(P, "train")
    q, k, v = _qkv()
    spec = prepare(q, k, v, is_causal=True).spec
    cell = Cell("xla", problem=P, mode="fwd+bwd")
    assert b(spec) == b(P) == b({**P.identity(), "mode": "fwd"}) == b(cell, "fwd")
    assert b(cell) == b(P, "train")
    assert b(prepare(q, k, v, is_causal=True, key_value_seq_lengths=np.array([40, 48])).spec).endswith("ragged")
    assert b(prepare(q, k, v, mask=np.ones((48, 48), bool)).spec).endswith("mask")
    assert "win:left" in b(Problem(1, 64, 64, 2, 2, 16, window=(8, 0)))
    assert "win:window" in b(Problem(1, 64, 64, 2, 2, 16, window=(8, 8)))


# --- auto reads the table ---------------------------------------------------------------------

def test_no_table_keeps_the_static_rule():
    e = attnlab.explain(*_qkv(), is_causal=True)
    assert e.chosen == "xla" and e.why.startswith("static rule")


def test_a_matching_entry_makes_auto_pick_naive_and_attention_run_it(table, monkeypatch):
    table(_entry("naive"))
    q, k, v = _qkv()
    e = attnlab.explain(q, k, v, is_causal=True)
    assert e.chosen == "naive"
    assert str(e).splitlines()[0] == ("auto runs: naive: measured 1 ms vs xla 2 ms, tuned 2026-12-03 "
                                      "(dispatch.json)")
    naive = backends.get("naive")
    calls = []
    orig = naive.run
    monkeypatch.setattr(naive, "run", lambda p: calls.append(1) or orig(p))
    out = np.asarray(attnlab.attention(q, k, v, is_causal=True))
    assert calls, "auto did not run naive"
    ref = reference_attention(q, k, v, is_causal=True)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5
    # another bucket (T=128 rounds to 128, not 64) keeps the static rule
    q2, k2, v2 = _qkv(Problem(2, 128, 128, 4, 2, 16, "float32", causal=True))
    assert attnlab.explain(q2, k2, v2, is_causal=True).chosen == "xla"


def test_a_stale_entry_is_never_used_and_explain_says_why(table):
    jax_now = running_version("jax")
    table(_entry("naive", versions={"jax": "0.0.1", "jaxlib": running_version("jaxlib"), "cudnn": None}))
    e = attnlab.explain(*_qkv(), is_causal=True)
    assert e.chosen == "xla"
    assert e.why == (f"dispatch entry tuned with jax 0.0.1, running jax {jax_now}: "
                     "static rule: first of cudnn, xla, naive that can run it")
    table(_entry("naive", device_kind="NVIDIA H200"))
    e = attnlab.explain(*_qkv(), is_causal=True)
    assert e.chosen == "xla" and "tuned on NVIDIA H200" in e.why
    # a backend library version in the entry that differs (or is absent here) makes it stale too
    table(_entry("naive", versions={**_entry()["versions"], "tokamax": "9.9.9"}))
    e = attnlab.explain(*_qkv(), is_causal=True)
    assert e.chosen == "xla" and "tokamax 9.9.9" in e.why


def test_an_entry_naming_a_backend_that_cannot_run_falls_back(table):
    table(_entry("cudnn"))
    e = attnlab.explain(*_qkv(), is_causal=True)
    assert e.chosen == "xla" and e.why.startswith("dispatch entry names cudnn, which cannot run this input")
    table(_entry("no-such-backend"))
    e = attnlab.explain(*_qkv(), is_causal=True)
    assert e.chosen == "xla" and "not registered" in e.why


def test_opt_out_and_unreadable_table(table, monkeypatch, tmp_path):
    path = table(_entry("naive"))
    monkeypatch.setenv(dispatch.ENV_VAR, "off")
    e = attnlab.explain(*_qkv(), is_causal=True)
    assert e.chosen == "xla" and e.why.startswith("ATTNLAB_DISPATCH=off")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setenv(dispatch.ENV_VAR, str(bad))
    e = attnlab.explain(*_qkv(), is_causal=True)
    assert e.chosen == "xla" and "not a readable dispatch table" in e.why
    monkeypatch.setenv(dispatch.ENV_VAR, str(path))
    assert attnlab.explain(*_qkv(), is_causal=True).chosen == "naive"


def test_default_path_follows_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    monkeypatch.setenv(dispatch.CACHE_VAR, str(tmp_path))
    assert dispatch.default_path() == str(tmp_path / "dispatch.json")
    monkeypatch.setenv(dispatch.ENV_VAR, "/x/y.json")
    assert dispatch.default_path() == "/x/y.json"


def test_gradients_look_up_the_train_bucket(table, monkeypatch):
    import jax

    table(_entry("naive", mode="train"))
    q, k, v = _qkv()
    assert attnlab.explain(q, k, v, is_causal=True).chosen == "xla"          # no fwd entry
    assert attnlab.explain(q, k, v, is_causal=True, mode="train").chosen == "naive"
    naive = backends.get("naive")
    calls = []
    orig = naive.run
    monkeypatch.setattr(naive, "run", lambda p: calls.append(1) or orig(p))
    jax.grad(lambda q: attnlab.attention(q, k, v, is_causal=True).sum())(q)
    assert calls


def test_fp8_pytorch_and_forward_only_entries_are_never_used(table, monkeypatch):
    """auto_ineligible and the backward check guard the measured pick (a forward entry too: a gradient
    call may not be recognised as one, e.g. grad(checkpoint(f)))."""
    from attnlab.backends.base import Backend

    for name in ("cudnn-fp8-hadamard", "te-fp8", "torch-cudnn"):
        b = backends.get(name)
        monkeypatch.setattr(b, "available", lambda: None)
        monkeypatch.setattr(b, "supports", lambda spec: None)
        table(_entry(name))
        e = attnlab.explain(*_qkv(), is_causal=True)
        assert e.chosen == "xla" and f"dispatch entry names {name}" in e.why, (name, e.why)
        assert ("FP8" in e.why) if "fp8" in name else ("not a JAX op" in e.why)

    class FwdOnly(Backend):
        name = "fwd-only-test"
        forward_only = True
        portable = True

        def run(self, p):
            raise AssertionError("never run")

    with backends.registered(FwdOnly()):
        table(_entry("fwd-only-test"))
        e = attnlab.explain(*_qkv(), is_causal=True)
        assert e.chosen == "xla" and "dispatch entry names fwd-only-test" in e.why


def test_the_newest_usable_entry_wins(table):
    """A second tune that measured another library's backends (its entry holds that version too)
    replaces the first one's entry of the bucket (merge), and lookup takes the newest."""
    old = [_entry("naive", date="2026-12-01")]
    new = [_entry("xla", date="2026-12-02", versions={**_entry()["versions"], "tokamax": running_version("tokamax")})]
    merged = dispatch.merge(old, new)
    assert [e["backend"] for e in merged] == ["xla"]
    table(*(old + new))          # a table with both (written by an older attnlab): the newest is used
    assert attnlab.explain(*_qkv(), is_causal=True).why.startswith("measured")
    assert attnlab.explain(*_qkv(), is_causal=True).chosen == "xla"


# --- building the table from records ----------------------------------------------------------

def _rec(backend, ms, status="ok", problem=P, mode="fwd", kind="cpu", jax_v="0.10.2", **env):
    return {**problem.identity(), "backend": backend, "mode": mode, "status": status, "kernel_ms": None,
            "wall_ms": ms if status == "ok" else None, "timer": "wall",
            "env": {"device_kind": kind, "jax": jax_v, "jaxlib": jax_v, "cudnn": None, "optional": env}}


def test_build_only_ranks_backends_ok_in_every_cell_of_the_bucket():
    P2 = Problem(2, 64, 64, 4, 2, 16, "float32", causal=True)            # same bucket as P (T 48 -> 64)
    recs = [_rec("naive", 0.5, "incorrect"), _rec("xla", 2.0), _rec("tokamax-xla", 3.0),
            _rec("naive", 0.5, problem=P2), _rec("xla", 2.0, problem=P2), _rec("tokamax-xla", 1.0, problem=P2)]
    (e,) = dispatch.build(recs, lambda b: ["tokamax"] if b.startswith("tokamax") else [], date="2026-12-03")
    assert e["backend"] == "tokamax-xla" and e["ms"] == pytest.approx(3 ** 0.5)   # geometric mean
    assert [r["backend"] for r in e["runner_up"]] == ["xla"] and e["cells"] == 2   # naive failed once: out
    assert e["versions"] == {"jax": "0.10.2", "jaxlib": "0.10.2", "cudnn": None, "tokamax": None}
    # nothing ok: no entry at all; unchecked is not ok
    assert dispatch.build([_rec("naive", 1.0, "unchecked"), _rec("xla", 1.0, "unsupported")]) == []


def test_build_keys_by_device_and_versions_and_merge_replaces_only_the_same():
    recs = [_rec("naive", 1.0), _rec("xla", 2.0), _rec("xla", 1.0, jax_v="0.9.0"), _rec("naive", 2.0, jax_v="0.9.0")]
    entries = dispatch.build(recs)
    assert sorted((e["versions"]["jax"], e["backend"]) for e in entries) == [("0.10.2", "naive"), ("0.9.0", "xla")]
    newer = dispatch.build([_rec("xla", 0.1), _rec("naive", 1.0)])
    merged = dispatch.merge(entries, newer)
    assert sorted((e["versions"]["jax"], e["backend"]) for e in merged) == [("0.10.2", "xla"), ("0.9.0", "xla")]


def test_build_ignores_other_input_distributions():
    recs = [_rec("naive", 1.0), _rec("xla", 2.0), {**_rec("xla", 0.1), "inputs": "outliers"}]
    (e,) = dispatch.build(recs)
    assert e["backend"] == "naive" and e["cells"] == 1


def test_load_refuses_other_files(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"schema": 99, "kind": "attnlab-dispatch", "entries": []}))
    with pytest.raises(dispatch.DispatchError):
        dispatch.load(str(p))
    assert dispatch.load(str(tmp_path / "absent.json")).entries == ()
    p.write_text(json.dumps({"schema": 1, "kind": "attnlab-dispatch", "entries": [{"bucket": "x", "backend": "naive"}]}))
    with pytest.raises(dispatch.DispatchError, match="entry 0"):
        dispatch.load(str(p))


@pytest.mark.parametrize("field,bad", [("runner_up", [1]), ("runner_up", [{}]),
                                       ("runner_up", [{"backend": "xla", "ms": "fast"}]),
                                       ("runner_up", [{"backend": "xla", "ms": float("nan")}]),
                                       ("versions", {}), ("versions", {"jax": "0.1", "jaxlib": "0.1"}),
                                       ("versions", {"jax": 1, "jaxlib": "0.1", "cudnn": None}), ("ms", -1.0)])
def test_a_malformed_entry_refuses_the_file_and_auto_keeps_the_static_rule(table, field, bad):
    """A bad runner_up item or versions without jax/jaxlib/cuDNN: load refuses the file, so auto falls back
    (not a TypeError or KeyError from attention itself, nor an entry used on any versions)."""
    path = table(_entry("naive", **{field: bad}))
    with pytest.raises(dispatch.DispatchError, match=f"entry 0: field.s. {field}"):
        dispatch.load(str(path))
    e = attnlab.explain(*_qkv(), is_causal=True)
    assert e.chosen == "xla" and f"field(s) {field}" in e.why and "static rule" in e.why
    assert np.asarray(attnlab.attention(*_qkv(), is_causal=True)).shape == (2, 48, 4, 16)


def test_an_entry_not_naming_a_base_version_is_stale():
    e = _entry("naive", versions={})
    assert "tuned with jax ?" in dispatch.stale_reason(e, e["device_kind"], running_version)


# --- attnlab tune, end to end -----------------------------------------------------------------

def test_tune_writes_the_table_auto_then_uses(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from attnlab.cli import main

    out = tmp_path / "d.json"
    r = CliRunner().invoke(main, ["tune", "--backends", "naive,xla", "--seq", "48", "--heads", "4", "--kv-heads", "2",
                                  "--head-dim", "16", "--batch", "2", "--dtype", "float32", "--causal", "true",
                                  "--repeats", "3", "--min-time", "0", "--out", str(out)])
    assert r.exit_code == 0, r.output
    t = dispatch.load(str(out))
    (e,) = t.entries
    assert e["bucket"] == dispatch.bucket(P) and e["backend"] in ("naive", "xla") and e["device_kind"] == "cpu"
    assert [x["backend"] for x in e["runner_up"]] == [{"naive": "xla", "xla": "naive"}[e["backend"]]]
    (recs,) = list((tmp_path / "tune-records").glob("*/results.jsonl"))   # one folder per device + versions
    assert recs.parent.name.startswith("cpu-jax") and f"jax{running_version('jax')}" in recs.parent.name
    monkeypatch.setenv(dispatch.ENV_VAR, str(out))
    ex = attnlab.explain(*_qkv(), is_causal=True)
    assert ex.chosen == e["backend"] and ex.why.startswith("measured")


def test_an_interrupted_tune_ranks_only_buckets_whose_cells_all_finished(tmp_path, monkeypatch):
    """Ctrl-C after three of four cells (two buckets, two backends): the bucket where one backend was never
    measured gets no entry (it would name the measured one as fastest)."""
    from click.testing import CliRunner

    import attnlab.sweep
    from attnlab.cli import main

    real = attnlab.sweep.run_sweep

    def three_cells(sweep, out_dir, **kw):
        seen = kw.pop("on_cell")

        def on_cell(cell, rec, i, total):
            seen(cell, rec, i, total)
            if i == 2:
                raise KeyboardInterrupt
        return real(sweep, out_dir, on_cell=on_cell, **kw)

    monkeypatch.setattr(attnlab.sweep, "run_sweep", three_cells)
    out = tmp_path / "d.json"
    r = CliRunner().invoke(main, ["tune", "--backends", "naive,xla", "--seq", "16,64", "--heads", "2", "--head-dim",
                                  "8", "--dtype", "float32", "--repeats", "2", "--min-time", "0", "--out", str(out)])
    assert r.exit_code == 130 and "3 of 4 cells finished" in r.output, r.output
    (e,) = dispatch.load(str(out)).entries
    assert len(e["runner_up"]) == 1 and e["cells"] == 1


@pytest.mark.parametrize("text", ["{not json", json.dumps({"schema": 1, "kind": "attnlab-dispatch",
                                                            "entries": [{"bucket": "x"}]})])
def test_tune_refuses_a_corrupt_out_before_measuring(tmp_path, monkeypatch, text):
    from click.testing import CliRunner

    import attnlab.sweep
    from attnlab.cli import main

    monkeypatch.setattr(attnlab.sweep, "run_sweep", lambda *a, **k: pytest.fail("measured before refusing --out"))
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    r = CliRunner().invoke(main, ["tune", "--backends", "naive,xla", "--seq", "16", "--heads", "2", "--head-dim", "8",
                                  "--dtype", "f32", "--out", str(bad)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    (line,) = r.output.strip().splitlines()
    assert line.startswith(f"error: --out {bad}: ") and "--replace" in line
    assert bad.read_text() == text and not (tmp_path / "tune-records").exists()


def test_tune_refuses_bwd_and_prints_reasons_as_text(tmp_path, monkeypatch):
    """auto picks for a forward call or a training step: tune --mode bwd is refused (exit 2) before measuring; a
    cell's reason ("pip install -e '.[torch]'") is printed as written, not read as a style tag."""
    from click.testing import CliRunner

    import attnlab.sweep
    from attnlab.cli import main

    args = ["tune", "--backends", "xla", "--seq", "16", "--heads", "2", "--head-dim", "8", "--dtype", "f32",
            "--out", str(tmp_path / "d.json")]
    monkeypatch.setattr(attnlab.sweep, "run_sweep", lambda *a, **k: pytest.fail("measured a bwd tune"))
    r = CliRunner().invoke(main, [*args, "--mode", "fwd,bwd"])
    assert r.exit_code == 2 and "mode: bwd is not a mode auto picks for" in r.output
    # cells that key no entry (they were measured, then "0 dispatch entries" without why)
    for line in ("soft_cap = [50.0]", 'inputs = ["outliers"]', "sinks = [true]"):
        (tmp_path / "t.toml").write_text(f"[sweep]\n{line}\n")
        r = CliRunner().invoke(main, [*args, "--config", str(tmp_path / "t.toml")])
        assert r.exit_code == 2 and "key no entry" in r.output, r.output

    def run_sweep(sweep, out, on_cell, **kw):
        on_cell(sweep.cells()[0], {"status": "unavailable", "reason": "torch is not installed (pip install -e '.[torch]')"}, 0, 1)
        return []
    monkeypatch.setattr(attnlab.sweep, "run_sweep", run_sweep)
    r = CliRunner().invoke(main, args)
    assert "(pip install -e '.[torch]')" in r.output, r.output


def test_tune_is_a_command():
    from click.testing import CliRunner

    from attnlab.cli import main

    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0 and "tune" in r.output
    r = CliRunner().invoke(main, ["tune", "--help"])
    assert r.exit_code == 0 and "--out" in r.output and "--config" in r.output


def test_capped_and_packed_calls_are_their_own_never_tuned_buckets():
    """A soft-capped, packed or sinks record keys no entry, and such a call never looks up a plain entry."""
    assert dispatch.build([_rec("xla", 1.0) | {"soft_cap": 50.0}, _rec("naive", 1.0) | {"packing": "docs:4"},
                           _rec("xla", 1.0) | {"sinks": True}]) == []
    q, k, v = attnlab.reference.inputs.random_qkv(1, 48, 48, 4, 2, 16, "float32", seed=0)
    ids = np.zeros((1, 48), np.int32)
    plain = dispatch.bucket(attnlab.explain(q, k, v, is_causal=True).spec)
    capped = dispatch.bucket(attnlab.explain(q, k, v, is_causal=True, logits_soft_cap=30.0).spec)
    packed = dispatch.bucket(attnlab.explain(q, k, v, is_causal=True, query_segment_ids=ids,
                                             key_value_segment_ids=ids).spec)
    assert capped == plain + " softcap" and packed == plain + " segments"
    sinks = np.zeros((4,), np.float32)
    assert dispatch.bucket(attnlab.explain(q, k, v, is_causal=True, sinks=sinks).spec) == plain + " sinks"
