"""The notebook runs top to bottom on the CPU without an error (executed with nbclient)."""
import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from attnlab import notebook  # noqa: E402

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
