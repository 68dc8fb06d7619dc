"""The notebook runs top to bottom on the CPU without an error (executed with nbclient)."""
import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from attnlab.report import notebook  # noqa: E402

NB = os.path.join(os.path.dirname(__file__), "..", "notebooks", "attnlab_codelab.ipynb")


def test_notebook_executes(tmp_path):
    nb = nbformat.read(NB, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert any("text/html" in o.get("data", {}) for o in outputs)


def test_helpers_escape_and_print():
    t = notebook.show_table([{"a": "<b>", "b": 1.23456}])
    assert "&lt;b&gt;" in t._repr_html_() and "1.235" in str(t)
    with pytest.raises(ValueError):
        notebook.show_table([[1, 2]])
    fig = notebook.show_bars(["x", "y"], [1, 2], title="t")
    assert fig.axes and len(fig.axes[0].patches) == 2
    fig = notebook.plot_sweep([{"backend": "xla", "status": "ok", "q_len": 64, "wall_ms": 1.0, "kernel_ms": None},
                               {"backend": "xla", "status": "ok", "q_len": 128, "wall_ms": 2.0, "kernel_ms": None}])
    assert len(fig.axes[0].lines) == 1


def test_show_table_reads_cell_records():
    """measure_cell returns a CellRecord (a Mapping, not a dict): the table shows its values, not its field names."""
    from attnlab.core.record_model import CellRecord

    rec = CellRecord.from_flat({"backend": "naive", "batch": 1, "q_len": 4, "kv_len": 4, "heads": 1, "kv_heads": 1,
                                "head_dim": 8, "dtype": "float32", "causal": False, "mode": "fwd", "status": "ok",
                                "reason": None, "schema": 2, "timer": "wall", "wall_ms": 1.5, "kernel_ms": None,
                                "rel_err": 0.0, "checked_fraction": 1.0, "tolerance": "f32", "checks": {"ref": "ok"}})
    t = notebook.show_table([rec], columns=["backend", "status", "wall_ms", "kernel_ms"])
    assert t.rows == [["naive", "ok", "1.5", ""]]
    assert notebook.show_table([rec]).rows[0][notebook.show_table([rec]).columns.index("backend")] == "naive"


def _outputs_text(nb) -> str:
    parts = []
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        for o in c.get("outputs", []):
            parts.append(str(o.get("text", "")))
            parts.extend(str(v) for k, v in o.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(parts)


def test_committed_notebook_has_cpu_outputs():
    nb = nbformat.read(NB, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("outputs") and c.get("execution_count") for c in code), "commit the notebook executed"
    assert not [o for c in code for o in c.outputs if o.get("output_type") == "error"]
    text = _outputs_text(nb)
    assert "cpu" in text and any("image/png" in o.get("data", {}) for c in code for o in c.outputs)


def test_notebook_kv_cache_row_is_the_reports():
    from attnlab.report import shared_rows

    nb = nbformat.read(NB, as_version=4)
    text = _outputs_text(nb)
    mqa = next(r for r in shared_rows.kv_cache_rows() if r[0] == "MQA")
    assert mqa[1] == 1 and mqa[3] == "0.12 GiB"
    assert any(line.split()[:2] == ["MQA", "1"] and "0.12 GiB" in line for line in text.splitlines())
    assert "0.50 GiB" not in text
    html = notebook.kv_cache_table()._repr_html_()
    assert "<td>MQA</td><td>1</td>" in html and "0.12 GiB" in html


def test_notebook_never_says_cudnn_accepts_without_a_gpu():
    import jax

    nb = nbformat.read(NB, as_version=4)
    assert "cuDNN accepts" not in _outputs_text(nb)      # the committed outputs come from a CPU run
    t = notebook.cudnn_head_dims()
    if jax.default_backend() != "gpu":
        assert "accepts" not in str(t) and "cannot run here" in t.title
        assert any("refused" in r[1] for r in t.rows) and any("allowed" in r[1] for r in t.rows)
