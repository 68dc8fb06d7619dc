"""docs/cli.md (issue 23 item 6): its sweep.toml example parses into the cells it says, with every
key, and its step table lists every step of `attnlab run`."""
import importlib.util
import pathlib
import re

import pytest

from attnlab.sweep import build, load_toml
from attnlab.sweep.flags import merge

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "cli.md"


@pytest.fixture
def example(tmp_path):
    text = DOC.read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert len(blocks) == 1
    p = tmp_path / "sweep.toml"
    p.write_text(blocks[0])
    return p, text


def test_the_sweep_toml_example_parses_into_the_cells_it_says(example):
    path, text = example
    values, run = load_toml(path)
    sweep = build(values)
    said = int(re.search(r"\*\*(\d+) cells\*\*", text).group(1))
    assert len(sweep.cells()) == said
    assert sweep.backends == ["xla", "cudnn"] and {c.dtype for c in sweep.cells()} == {"bfloat16"}
    # every key: the alternatives (q_len/kv_len for seq, tokens for batch, backend) are in its comments
    assert set(values) == {"name", "backends", "batch", "seq", "heads", "kv_heads", "head_dim", "dtype", "causal",
                           "window", "mode", "inputs", "lengths", "devices", "strategy"}
    assert set(run) == {"repeats", "warmup", "min_time", "compile_budget", "check"}


def test_the_documented_flag_note_is_what_bench_says(example):
    path, text = example
    _, _, notes = merge(str(path), {"seq": "16"})
    shown = re.search(r"note: (--seq replaces .*)", text).group(1)
    assert notes == [shown.replace("sweep.toml", str(path))]


def _step_table_tool():
    spec = importlib.util.spec_from_file_location("step_table_tool", DOC.parents[1] / "tools" / "step_table.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_the_step_table_is_the_registrys():
    """docs/cli.md's table of steps is generated from ``attnlab.lab.steps`` (``tools/step_table.py --write``)."""
    from attnlab.lab import STEPS

    tool = _step_table_tool()
    _, table, _ = tool.split(DOC.read_text())
    assert table == tool.generate(), "docs/cli.md's table of steps is out of date: run `python tools/step_table.py --write`"
    rows = re.findall(r"^\| `([a-z_0-9]+)` \| (.*?) \|$", table, re.M)
    assert [(sid, title.replace("`", "")) for sid, title in rows] == [(s.id, s.title) for s in STEPS.values()]


def test_every_flag_of_run_is_documented():
    """Each of `attnlab run`'s flags is named in cli.md's `attnlab run` section."""
    from attnlab.cli import main

    text = DOC.read_text()
    section = text[text.index("## `attnlab run`"):text.index("## The lab's steps")]
    flags = [o for p in main.commands["run"].params for o in p.opts if o.startswith("--")]
    assert "--quick" in flags and [f for f in flags if f"`{f}" not in section] == []
