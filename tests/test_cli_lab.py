import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from attnlab.cli import main


def test_env_json():
    r = CliRunner().invoke(main, ["env", "--json"])
    assert r.exit_code == 0, r.output
    e = json.loads(r.output)
    for k in ("jax", "jaxlib", "platform", "devices", "optional", "backends", "cudnn"):
        assert k in e
    if e["platform"] == "cpu":
        assert "GPU paths" in e["gpu_note"]
        assert e["backends"]["cudnn"]["available"] is False


#: the commands the README's tour names: each must be listed with its one-line help
DOCUMENTED_COMMANDS = {"run", "bench", "compare", "tune", "advise", "env", "backends", "models", "ceilings", "scaling"}


def listed_commands(help_text: str) -> dict[str, str]:
    """name -> one-line help of each row of the "Commands:" section of ``--help``."""
    section = re.split(r"^Commands:$", help_text, maxsplit=1, flags=re.M)[1]
    rows = [line.split(None, 1) for line in section.splitlines() if line.startswith("  ") and line.strip()]
    return {row[0]: row[1] if len(row) > 1 else "" for row in rows}


def test_help_lists_every_command_with_its_help():
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0
    listed = listed_commands(r.output)
    assert DOCUMENTED_COMMANDS <= set(listed), DOCUMENTED_COMMANDS - set(listed)
    assert set(listed) == {n for n, c in main.commands.items() if not c.hidden}
    assert all(listed.values()), [n for n, h in listed.items() if not h]
    assert listed_commands("Commands:\n  run  Run it.\n  env\n") == {"run": "Run it.", "env": ""}


def test_run_writes_report_and_results(quick_run):
    out, r = quick_run   # the session's quick run (conftest), its label starting with "<b>ci & test</b>"
    assert r.exit_code == 0, r.output
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    steps = [x for x in recs if x["kind"] == "lab_step"]
    assert [x["step"] for x in steps] == ["environment", "qkv", "naive", "jax_nn", "cudnn", "causal",
                                          "timing", "sweeps", "gqa", "te_fp8", "next", "decode"]
    assert all(x["status"] in ("ok", "skipped") for x in steps), [(x["step"], x["reason"]) for x in steps]
    cells = [x for x in recs if x["kind"] == "cell"]
    assert cells and all(x["status"] in ("ok", "unsupported") for x in cells)
    assert all(x["status"] == "ok" for x in cells if x["backend"] in ("naive", "xla"))
    assert quick_run_too_big(cells) == [], quick_run_too_big(cells)
    assert len(list((out / "plots").glob("*.png"))) >= 5
    html = (out / "report.html").read_text()
    assert "&lt;b&gt;ci &amp; test&lt;/b&gt;" in html and "<b>ci" not in html
    assert (out / "results.csv").read_text().startswith("kind,")


#: issue 12: --quick is a smoke test (~12 s on 2 cores; 72 s before). Its time is compiles and the
#: host clock's minimum time per cell, so its size is held by the plan, not by a clock: at most this
#: many cells (19 at 1e29b30), of at most this many FLOPs together (6.3e7) and each.
QUICK_MAX_CELLS, QUICK_MAX_FLOPS, QUICK_MAX_CELL_FLOPS = 24, 1e8, 2**23


def quick_run_too_big(cells: list[dict]) -> list[str]:
    """What makes a --quick run's plan bigger than a smoke test may be (empty: nothing)."""
    flops = [x.get("flops") or 0 for x in cells]
    return ([f"{len(cells)} cells > {QUICK_MAX_CELLS}"] * (len(cells) > QUICK_MAX_CELLS)
            + [f"{sum(flops):.3g} FLOPs > {QUICK_MAX_FLOPS:g}"] * (sum(flops) > QUICK_MAX_FLOPS)
            + [f"{x.get('backend')} T{x.get('q_len')}: {f:.3g} FLOPs" for x, f in zip(cells, flops) if f > QUICK_MAX_CELL_FLOPS])


def test_quick_size_check_sees_a_big_plan():
    small = {"backend": "xla", "q_len": 32, "flops": 1e6}
    assert quick_run_too_big([small] * 19) == []
    assert quick_run_too_big([small] * 25) == ["25 cells > 24"]
    assert quick_run_too_big([{"backend": "xla", "q_len": 4096, "flops": 2e9}]) == ["2e+09 FLOPs > 1e+08",
                                                                             "xla T4096: 2e+09 FLOPs"]


def test_bad_section_exits_nonzero(tmp_path):
    r = CliRunner().invoke(main, ["run", "--out", str(tmp_path), "--sections", "nope"])
    assert r.exit_code != 0 and "nope" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("module", ["attnlab.cli", "attnlab"])
def test_console_script_runs(module):
    r = subprocess.run([sys.executable, "-m", module, "backends", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert set(json.loads(r.stdout)) >= {"naive", "xla", "cudnn"}
