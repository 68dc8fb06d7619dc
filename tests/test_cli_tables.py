"""Issue 23 item 5 (tables that fit): in a pipe or a terminal under 100 columns, bench and compare print
a line per cell with every number whole, env and explain group the unavailable backends by reason,
backend names are never split, and --wide gives the full table."""
import io
import json
import re

import pytest
from click.testing import CliRunner
from rich.console import Console

from attnlab import backends
from attnlab.cli import console, main
from attnlab.cli._layout import compact, packed
from attnlab.cli.tables import print_bench_table

BACKENDS = ("naive", "cudnn-fp8-hadamard-smoothk")


@pytest.fixture
def at_80_columns(monkeypatch):
    monkeypatch.setattr(console, "_width", 80)


def _rec(backend, q_len, ms, causal=False, status="ok", reason=None):
    return {"kind": "cell", "backend": backend, "batch": 1, "q_len": q_len, "kv_len": q_len, "heads": 8, "kv_heads": 2,
            "head_dim": 64, "dtype": "bfloat16", "causal": causal, "window": None, "mode": "fwd+bwd", "devices": 1,
            "strategy": None, "status": status, "reason": reason, "timer": "cupti",
            "kernel_ms": ms if status == "ok" else None, "kernel_min_ms": ms * 0.98765, "kernel_p25_ms": ms * 0.99,
            "kernel_p75_ms": ms * 1.01234, "kernel_max_ms": ms * 1.1, "wall_ms": ms * 2, "tflops": 0.0261234,
            "pct_peak": None, "gbps": None, "env": {"device_kind": "cpu"}}


def _records(scale=1.0):
    """48 cells: 24 configurations x 2 backends (one with a 26-character name)."""
    return [_rec(b, q, 0.0123456 * q * scale * (1 + i), causal=c)
            for q in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
            for c in (False, True) for i, b in enumerate(BACKENDS)]


def _lines(text):
    return text.rstrip("\n").splitlines()


def _fits(text, width=80):
    lines = _lines(text)
    assert "…" not in text
    assert max(map(len, lines)) <= width, max(lines, key=len)
    return lines


def test_layout_rule():
    term = lambda w: Console(file=io.StringIO(), force_terminal=True, width=w)  # noqa: E731
    assert compact(False, term(80)) and not compact(False, term(120)) and not compact(True, term(80))
    assert compact(False, Console(file=io.StringIO(), width=200))       # a pipe, however wide
    assert packed(["cudnn-fp8-hadamard-smoothk", "te", "te-fp8"], 30, sep=", ") == ["cudnn-fp8-hadamard-smoothk, te",
                                                                                     "te-fp8"]


def test_compare_in_a_pipe_at_80_columns_is_a_line_per_cell(tmp_path, at_80_columns):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    b.write_text("".join(json.dumps(r) + "\n" for r in _records(1.3)))
    r = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert r.exit_code == 1, r.output
    lines = _fits(r.output)
    assert len(lines) <= 48 + 24 + 6                     # a line per cell, one per configuration, the legend
    assert "cudnn-fp8-hadamard-smoothk" in r.output and "SLOWER" in r.output and "[min, p75]" in r.output
    assert "1618 [1598,1638] → 2104 [2078,2130]  ×1.3" in r.output        # every number whole (naive, T=131072)
    w = CliRunner().invoke(main, ["compare", str(a), str(b), "--wide"])
    assert "┃ configuration" in w.output and "…" not in w.output and "[1598, 1638]" in w.output


def test_bench_table_in_a_pipe_fits_and_names_why_a_cell_was_not_timed(capsys, at_80_columns):
    recs = _records()
    recs[1] = _rec(BACKENDS[1], 64, 1.0, status="unsupported", reason=f"{BACKENDS[1]}: needs an NVIDIA GPU")
    print_bench_table(recs, "out")
    out = capsys.readouterr().out
    lines = _fits(out)
    assert len(lines) <= 48 + 24 + 5
    assert "unsupported (1)" in out and "(1) cudnn-fp8-hadamard-smoothk: needs an NVIDIA GPU" in out
    assert "0.7901 · 26.12 GFLOP/s · –" in out          # naive T=64: ms · FLOP/s in the report's unit · %peak
    print_bench_table(recs, "out", wide=True)
    out = capsys.readouterr().out
    assert "┃ configuration" in out and "…" not in out and "(1) cudnn-fp8-hadamard-smoothk" in out


def test_bench_prints_the_reason_of_an_unsupported_cell(tmp_path, at_80_columns):
    r = CliRunner().invoke(main, ["bench", "--backends", "naive,cudnn", "--seq", "8", "--heads", "2", "--head-dim", "4",
                                  "--dtype", "float32", "--repeats", "1", "--min-time", "0", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    reason = json.loads((tmp_path / "o" / "results.jsonl").read_text().splitlines()[1])["reason"]
    assert reason and " ".join(reason.split()) in " ".join(r.output.split())


def _whole_names(text):
    found = set(re.findall(r"[a-z0-9][a-z0-9.-]*", text))
    return [n for n in backends.names() if n not in found]


def test_env_at_80_columns_groups_the_unavailable_backends(at_80_columns):
    r = CliRunner().invoke(main, ["env"])
    assert r.exit_code == 0, r.output
    lines = _fits(r.output)
    assert not _whole_names(r.output)                      # every backend name on one line, whole
    reasons = [s["reason"] for s in json.loads(CliRunner().invoke(main, ["backends", "--json"]).output).values()
               if not s["available"]]
    for why in set(reasons):                               # each reason once
        assert " ".join(r.output.split()).count(" ".join(why.split())) == 1
    assert len(lines) <= 30 + len(backends.names()) // 3
    w = CliRunner().invoke(main, ["backends", "--wide"])
    assert not _whole_names(w.output) and "┃ backend" in w.output


def test_explain_columns_do_not_drift_and_reasons_are_grouped():
    from attnlab.api.dot_product import reason_lines

    lines = reason_lines({"naive": None, "a-backend-of-26-characters": "its own reason", "xla": None,
                          "te": "needs a GPU", "pallas-triton": "needs a GPU"})
    own = [x for x in lines if x.endswith(("ok", "its own reason"))]
    assert len(own) == 3 and len({x.index(" ok") if x.endswith("ok") else x.index(" no:") for x in own}) == 1
    assert sum("needs a GPU" in x for x in lines) == 1 and "te, pallas-triton" in "\n".join(lines)


def test_explain_on_this_machine_says_each_reason_once():
    import jax.numpy as jnp

    import attnlab

    q = jnp.zeros((1, 8, 2, 16), jnp.float32)
    e = attnlab.explain(q, q, q)
    text = str(e)
    for why in {w for w in e.reasons.values() if w}:
        assert text.count(why) == 1
    assert not _whole_names(text)


def test_models_at_80_columns_fits(at_80_columns):
    r = CliRunner().invoke(main, ["models"])
    assert r.exit_code == 0 and "gemma-2-27b: query_pre_attn_scalar 144" in " ".join(r.output.split())
    _fits(r.output)
