"""A cell's identity fields are declared once (``attnlab.core.cell_fields``): the Cell, the record's Problem
part, the Sweep's axes, the bench flags, the label, recount and model matching all follow the declaration."""
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap

from attnlab.cli.bench import bench
from attnlab.core import cell_fields
from attnlab.core.record_model import Problem as RecordProblem
from attnlab.measure.cell import IDENTITY, IDENTITY_DEFAULTS, Cell
from attnlab.sweep.spec import Sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_consumer_has_every_declared_field():
    names = cell_fields.NAMES
    cell = [f.name for f in dataclasses.fields(Cell)]
    assert cell[3:] == list(names) and IDENTITY[-len(names):] == names
    assert IDENTITY_DEFAULTS == cell_fields.DEFAULTS
    assert list(RecordProblem.model_fields)[11:11 + len(names)] == list(names)
    axes = [f.name for f in cell_fields.CELL_FIELDS if f.axis]
    sweep = {f.name: f.default_factory() for f in dataclasses.fields(Sweep) if f.name in axes}
    assert sweep == {f.name: [f.default] for f in cell_fields.CELL_FIELDS if f.axis}
    assert {p.name for p in bench.params} >= set(axes)


#: Appended to the declaration, and nothing else edited: the field must reach every consumer.
NEW_FIELD = ('    CellField("temperature", None, Optional[str], "lower_names", _part("temp={}", "temperature"), help="T.",\n'
             '              skip=lambda a: a["temperature"] == "hot" and a["mode"] != "fwd"),\n')

CHECK = textwrap.dedent("""
    import dataclasses
    import json
    from attnlab.cli.bench import bench
    from attnlab.core.cell_fields import record_values
    from attnlab.core.model_plan import plan
    from attnlab.core.models import preset
    from attnlab.core.record_model import CellRecord
    from attnlab.measure.cell import Cell, Options, measure_cell, record_key
    from attnlab.measure.recount import recounted_workload
    from attnlab.sweep import build

    sweep = build({"backends": "naive", "batch": "1", "seq": "8", "heads": "1", "head_dim": "8", "dtype": "float32",
                   "mode": "fwd,bwd", "temperature": "none,HOT"})
    cells = sweep.cells()      # the field's own rule leaves out hot bwd cells
    assert [(c.mode, c.temperature) for c in cells] == [("fwd", None), ("fwd", "hot"), ("bwd", None)], cells
    hot = cells[1]
    assert hot.identity()["temperature"] == "hot" and hot.config_label.endswith(" temp=hot"), hot.config_label
    assert dataclasses.replace(hot, temperature=None) == cells[0] and Cell("naive", 1, 8, 8, 1, 1, 8, "float32",
                                                                           temperature="hot") == hot
    old = {k: v for k, v in json.loads(cells[0].key()).items() if k != "temperature"}
    assert record_key(old) == cells[0].key() != hot.key()          # old records read as the default
    rec = measure_cell(hot, Options(repeats=1, min_time_s=0.0)).flat()
    assert rec["status"] == "ok" and rec["temperature"] == "hot" and record_key(rec) == hot.key(), rec
    assert CellRecord.from_flat(rec).problem.temperature == "hot"
    assert recounted_workload(rec) == hot.workload and record_values(rec)["temperature"] == "hot"
    assert "temperature" in {p.name for p in bench.params}
    from attnlab.sweep.engine import CSV_COLUMNS
    assert CSV_COLUMNS[CSV_COLUMNS.index("status") - 1] == "temperature"    # the identity's last column
    entry = plan(preset("llama-3.1-8b"), "prefill", "256")[0]
    rec0 = {k: v[0] for k, v in entry.axes().items()}
    assert entry.matches(rec0) and not entry.matches({**rec0, "temperature": "hot"})
    print("flowed")
""")


def test_a_new_identity_field_flows_through_with_no_other_edit(tmp_path):
    src = tmp_path / "attnlab"
    shutil.copytree(os.path.join(ROOT, "src", "attnlab"), src, ignore=shutil.ignore_patterns("__pycache__"))
    decl = src / "core" / "cell_fields.py"
    text = decl.read_text()
    end = text.index("\n)\n", text.index("CELL_FIELDS: tuple"))
    decl.write_text(text[:end + 1] + NEW_FIELD + text[end + 1:])
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and "flowed" in out.stdout, out.stderr[-3000:]
