"""Small things the command line says instead of passing over: ``attnlab scaling`` with nothing to show
exits 2 with a line (as compare's "nothing comparable"), one reason is one footnote however it is
spelt, and an ``ATTNLAB_DISPATCH`` file that is not there is reported as a corrupt one is."""
import json

import jax.numpy as jnp
import pytest
from click.testing import CliRunner

import attnlab
from attnlab.api import dispatch
from attnlab.cli import main
from attnlab.cli.tables import Footnotes, print_footnotes


def _cell(**kw):
    return {"kind": "cell", "backend": "xla", "batch": 1, "q_len": 16, "kv_len": 16, "heads": 2, "kv_heads": 2,
            "head_dim": 8, "dtype": "float32", "causal": False, "window": None, "mode": "fwd", "devices": 1,
            "strategy": None, "status": "unsupported", "reason": "xla: not here", **kw}


@pytest.mark.parametrize("records,says", [([_cell()], "no sharded cell timed, nothing to show"),
                                          ([], "no")])
def test_scaling_with_nothing_to_show_says_so_and_exits_2(tmp_path, records, says):
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    r = CliRunner().invoke(main, ["scaling", str(tmp_path)])
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output


def test_one_reason_is_one_footnote_however_spelt(capsys):
    notes = Footnotes()
    a = notes.mark("cudnn", "unsupported", "cudnn: needs an NVIDIA GPU")
    b = notes.mark("cudnn", "unsupported", "needs an NVIDIA  GPU")
    c = notes.mark("te", "unsupported", "needs an NVIDIA GPU")
    assert a == b == "unsupported (1)" and c == "unsupported (2)"
    print_footnotes(attnlab.cli.console, notes.lines() + ["(3) torch: pip install -e '.[torch]'"])
    assert capsys.readouterr().out.splitlines() == ["(1) cudnn: needs an NVIDIA GPU", "(2) te: needs an NVIDIA GPU",
                                                    "(3) torch: pip install -e '.[torch]'"]


def test_a_dispatch_file_named_but_absent_is_reported_like_a_corrupt_one(tmp_path, monkeypatch):
    q = k = v = jnp.ones((1, 16, 2, 8), jnp.float32)
    monkeypatch.setenv(dispatch.ENV_VAR, str(tmp_path / "no-such.json"))
    e = attnlab.explain(q, k, v)
    assert "no-such.json: no dispatch table there" in e.why and "attnlab tune --out" in e.why
    (tmp_path / "bad.json").write_text("{not json")
    monkeypatch.setenv(dispatch.ENV_VAR, str(tmp_path / "bad.json"))
    assert "not a readable dispatch table" in attnlab.explain(q, k, v).why
    monkeypatch.delenv(dispatch.ENV_VAR)           # the default file, absent: no table yet, nothing to report
    monkeypatch.setenv(dispatch.CACHE_VAR, str(tmp_path / "cache"))
    assert "dispatch" not in attnlab.explain(q, k, v).why


def test_a_folder_name_with_brackets_is_printed_as_written(tmp_path):
    """Paths, notes and reasons are text: rich would read "[bold]" (or a reason's "[torch]") as a style tag and drop it."""
    out = tmp_path / "o[bold]x"
    args = ["bench", "--backends", "naive", "--seq", "16", "--heads", "2", "--head-dim", "8", "--dtype", "f32",
            "--repeats", "1", "--out", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    r = CliRunner().invoke(main, [*args, "--resume"])
    said = "".join(r.output.split())     # wrapped at the console's width
    for line in (f"cells already recorded in {out}/results.jsonl: resumed", f"cells already in {out}/results.jsonl",
                 f"1 resumed from {out}/results.jsonl"):
        assert "".join(line.split()) in said, (line, r.output)
    assert r.exit_code == 0


def test_combinations_a_rule_leaves_out_are_named(tmp_path):
    """``--devices 1,2`` without a strategy: the devices=2 cells are left out by a rule; bench ran the rest and said
    nothing of them."""
    r = CliRunner().invoke(main, ["bench", "--backends", "naive", "--seq", "16", "--heads", "2", "--head-dim", "8",
                                  "--dtype", "float32", "--devices", "1,2", "--out", str(tmp_path)], terminal_width=200)
    assert r.exit_code == 0 and "combinations left out (devices): devices > 1 need a strategy" in r.output, r.output
    assert attnlab.sweep.build(dict(backends="naive", seq="16", heads="2", head_dim="8")).left_out_notes() == []
