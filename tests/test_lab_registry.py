"""A lab step is its module plus one line in ``attnlab.lab.steps.MODULES``: everything else derives from them.

Shown on a copy of the package with a step added between ``qkv`` and ``naive``: its id, its number (and
every later step's), its renderer, ``attnlab run --help`` and ``--sections``, docs/cli.md's generated table of
steps, and ``run_lab`` running its probe (which reaches JAX through ``step_types.jax_side()``), with no
other file touched.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from attnlab.lab.steps import STEPS

ROOT = Path(__file__).resolve().parents[1]

ADDED_STEP = '''"""A step added by the test: its module and one registry line."""
from ..render_common import section_renderer
from ..step_types import Step, Table, jax_side

TITLE = "An added step"


def probe(ctx):
    return {"jax": jax_side().jax.__version__}


@section_renderer("added", TITLE)
def render(s, p, records, cfg, plots_dir=None):
    s.tables.append(Table("JAX", ["version"], [[p["jax"]]]))
    s.facts = {"jax": p["jax"]}


STEP = Step("added", TITLE, render, probe=probe)
'''

IN_THE_COPY = r"""
import json, sys
from click.testing import CliRunner
from attnlab.cli import main
from attnlab.cli.run import step_ids
from attnlab.lab import STEPS, run_lab
from attnlab.lab.render import RENDERERS
from attnlab.lab.step_types import LabConfig

sys.path.insert(0, sys.argv[2])
import step_table

done = run_lab(sys.argv[1], sections=["added"], config=LabConfig(batch=1, q_len=8, heads=1, head_dim=8, quick=True))
print(json.dumps({"titles": {s.id: s.title for s in STEPS.values()}, "renderers": list(RENDERERS),
                  "ran": [(s.id, s.title, s.status, s.facts.get("jax")) for s in done],
                  "help": " ".join(CliRunner().invoke(main, ["run", "--help"]).output.split()),
                  "sections": step_ids("ADDED,qkv", STEPS), "table": step_table.generate()}))
"""


def test_a_new_step_is_its_module_plus_one_registry_line(tmp_path):
    pkg = tmp_path / "src" / "attnlab"
    shutil.copytree(ROOT / "src" / "attnlab", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "lab" / "steps" / "added.py").write_text(ADDED_STEP)
    registry = pkg / "lab" / "steps" / "__init__.py"
    text = registry.read_text()
    assert text.count('"qkv", ') == 1
    registry.write_text(text.replace('"qkv", ', '"qkv", "added", '))   # the one registry line

    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    r = subprocess.run([sys.executable, "-c", IN_THE_COPY, str(tmp_path / "out"), str(ROOT / "tools")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])

    ids = list(STEPS)
    ids.insert(ids.index("qkv") + 1, "added")
    assert list(got["titles"]) == ids and got["renderers"] == ids
    for number, sid in enumerate(ids, start=1):   # the new step is 3, every later one moves down by one
        assert got["titles"][sid].startswith(f"{number}. "), (sid, got["titles"][sid])
    assert got["titles"]["added"] == "3. An added step"
    assert got["ran"] == [["added", "3. An added step", "ok", got["ran"][0][3]]] and got["ran"][0][3]
    assert re.search(r"step ids to run \(default: all\): environment, qkv, added, naive,", got["help"]), got["help"]
    assert got["sections"] == ["added", "qkv"]
    assert "| `added` | 3. An added step |\n| `naive` | 4. Attention written out |" in got["table"]


def test_lab_modules_import_nothing_inside_functions():
    """A step's probe and plan reach JAX through ``step_types.jax_side()`` (``lab/jax_side.py`` imports it at its
    top), not through imports of their own: none of the lab's modules imports inside a function."""
    import ast

    found = [f"{p.relative_to(ROOT)}:{node.lineno}" for p in sorted((ROOT / "src" / "attnlab" / "lab").rglob("*.py"))
             for fn in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
             for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert found == [], "imports inside the lab's functions (use step_types.jax_side()):\n" + "\n".join(found)
