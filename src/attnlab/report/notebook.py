"""Display helpers for notebooks: ``show_table``, ``show_bars``, ``plot_sweep``.

Each returns an object a notebook displays by itself (HTML table, matplotlib figure) and
that prints sensibly in a terminal too.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Iterable, Sequence

import jinja2

from ..core.records import time_ms
from . import shared_rows

# The title above the table, not a <caption>: a caption is as narrow as its table and wraps into a column.
_TABLE = jinja2.Environment(autoescape=True).from_string(
    "<figure style='margin:0.6rem 0'>{% if title %}<figcaption style='font-weight:600'>{{ title }}</figcaption>{% endif %}"
    "<table><thead><tr>{% for c in columns %}<th>{{ c }}</th>{% endfor %}</tr></thead><tbody>"
    "{% for r in rows %}<tr>{% for v in r %}<td>{{ v }}</td>{% endfor %}</tr>{% endfor %}</tbody></table></figure>")


class HtmlTable:
    """A small table: rendered as escaped HTML in a notebook, as aligned text elsewhere."""

    def __init__(self, columns: Sequence[str], rows: Sequence[Sequence], title: str | None = None):
        self.columns = list(columns)
        self.rows = [[_cell(v) for v in r] for r in rows]
        self.title = title

    def _repr_html_(self) -> str:
        return _TABLE.render(columns=self.columns, rows=self.rows, title=self.title)

    def __str__(self) -> str:
        widths = [max(len(str(c)), *(len(r[i]) for r in self.rows)) if self.rows else len(str(c))
                  for i, c in enumerate(self.columns)]
        line = lambda vals: "  ".join(str(v).ljust(w) for v, w in zip(vals, widths))  # noqa: E731
        out = ([self.title] if self.title else []) + [line(self.columns), line("-" * w for w in widths)]
        return "\n".join(out + [line(r) for r in self.rows])

    __repr__ = __str__


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def show_table(data, columns: Sequence[str] | None = None, title: str | None = None) -> HtmlTable:
    """A table from a list of mappings (dicts, ``CellRecord``s; ``columns`` picks fields) or of rows (with ``columns``)."""
    data = list(data)
    if data and isinstance(data[0], Mapping):
        columns = list(columns or data[0].keys())
        rows = [[d.get(c) for c in columns] for d in data]
    else:
        if columns is None:
            raise ValueError("columns is required when data is a list of rows")
        rows = data
    return HtmlTable(columns, rows, title)


def show_bars(labels: Iterable[str], values: Iterable[float], *, title: str = "", ylabel: str = ""):
    """A bar chart (matplotlib Figure) with each value written on its bar."""
    import matplotlib.pyplot as plt  # heavy: matplotlib, loaded when a plot is drawn

    labels, values = list(labels), [float(v) for v in values]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(labels, values, color="#4a7ab5")
    for i, v in enumerate(values):
        ax.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom", fontsize=8)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    plt.close(fig)
    return fig


def plot_sweep(records, x: str = "q_len", y: str = "time", *, title: str = "", logx: bool = True, logy: bool = True):
    """One line per backend of ``y`` ("time" = kernel or wall ms, or any record field) against ``x``."""
    import matplotlib.pyplot as plt  # heavy: matplotlib, loaded when a plot is drawn


    fig, ax = plt.subplots(figsize=(6, 3.6))
    ok = [r for r in records if r.get("status") == "ok"]
    for backend in dict.fromkeys(r["backend"] for r in ok):
        rs = sorted((r for r in ok if r["backend"] == backend), key=lambda r: r[x])
        ax.plot([r[x] for r in rs], [time_ms(r) if y == "time" else r[y] for r in rs], marker="o", label=backend)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel("ms" if y == "time" else y)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    plt.close(fig)
    return fig


def kv_cache_table(model: dict | None = None) -> HtmlTable:
    """The KV-cache calculator of ``attnlab run``'s report (the same rows: MHA K=32, GQA K=8, MQA K=1)."""
    title = shared_rows.KV_TITLE if model is None else f"KV-cache calculator: {model}"
    return HtmlTable(shared_rows.KV_COLUMNS, shared_rows.kv_cache_rows(model), title)


def cudnn_head_dims(head_dims=(32, 64, 128, 256, 512), *, seq: int = 1024, heads: int = 8) -> HtmlTable:
    """Which head dims cuDNN takes (bf16), as the report's next-steps section says it: "accepts" only where
    cuDNN can run; without an NVIDIA GPU only its shape rule, and the title says why."""
    rows, why = shared_rows.cudnn_head_dims(head_dims, seq=seq, heads=heads)
    title = "cuDNN and the head dim (bf16)" if not why else f"cuDNN's shape rule for the head dim (bf16); cuDNN cannot run here: {why}"
    return HtmlTable(["H", "cuDNN"], rows, title)
