"""The tables of ``attnlab bench`` (its cells) and ``attnlab compare`` (B / A per cell), each in two
layouts (``_layout``): the full table, and a compact one for pipes and narrow terminals that prints a
configuration line and then a line per cell, numbers whole. A cell that was not timed (unsupported,
incorrect, oom, ...) shows its status and a footnote number; the footnotes give the reasons, each once.
"""
from __future__ import annotations

from rich.markup import escape
from rich.table import Table as RichTable

from ..core.records import config_label, time_ms
from ..core.units import format_flops
from ..measure import peaks
from ..report.footnotes import Footnotes
from ._app import console
from ._layout import compact, table_console

_TIMED = ("ok", "unchecked")


def bench_cell_text(r: dict, ridge_intensity: float | None, bw_tbps: float | None) -> str:
    """One ok cell of the bench table: ms · FLOP/s (in the report's unit: ``units.format_flops``) · % of
    peak, or for a memory-bound cell
    (``peaks.memory_bound``: decode-like, intensity below the ridge) ms · GB/s · % of bandwidth."""
    ms = time_ms(r)
    tok = f" · {r['tokens_per_s']:.4g} tok/s" if r.get("tokens_per_s") else ""    # a serving cell's new tokens
    if peaks.memory_bound(r, ridge_intensity) and r.get("gbps") is not None:
        bw = f"{100 * r['gbps'] / (bw_tbps * 1000):.1f}% BW" if bw_tbps else "–"
        return f"{ms:.4g} · {r['gbps']:.4g} GB/s · {bw}{tok}"
    pk = f"{r['pct_peak']:.1f}%" if r.get("pct_peak") is not None else "–"
    return f"{ms:.4g} · {format_flops(r['tflops'] * 1e12)} · {pk}{tok}"


def print_footnotes(con, lines: list[str]) -> None:
    """A table's footnotes (``Footnotes.lines``), as text (a reason's "[torch]" is no style tag)."""
    for line in lines:
        con.print(escape(line), highlight=False, soft_wrap=True)


def print_bench_table(records: list[dict], out_dir: str, wide: bool = False) -> None:
    """The bench's cells: a configuration per row and a backend per column (ms · FLOP/s · % of peak,
    or for a memory-bound row ms · GB/s · % of bandwidth: ``bench_cell_text``)."""
    backends_ = list(dict.fromkeys(r["backend"] for r in records))
    rows: dict[str, dict] = {}
    for r in records:
        rows.setdefault(config_label(r), {})[r["backend"]] = r
    timer = next((r.get("timer") for r in records if r.get("timer")), "wall")
    kind = next((r["env"].get("device_kind") for r in records if isinstance(r.get("env"), dict)), None) or ""
    bw_tbps, bw_source = peaks.bandwidth_tbps(kind)
    ridges = {d: peaks.ridge(kind, d) for d in {r.get("dtype", "bfloat16") for r in records}}
    timed = lambda r: r is not None and r["status"] in _TIMED  # noqa: E731
    mb_rows = {label for label, by in rows.items()
               if any(timed(r) and peaks.memory_bound(r, ridges[r.get("dtype", "bfloat16")]) for r in by.values())}
    notes = Footnotes()

    def cell(r) -> str:
        if not timed(r):
            return f"[yellow]{escape(notes.mark(r['backend'], r['status'], r.get('reason')))}[/]"
        return bench_cell_text(r, ridges[r.get("dtype", "bfloat16")], bw_tbps)

    title = f"{len(records)} cells → {out_dir}/results.jsonl  (time: {'CUPTI kernel' if timer == 'cupti' else 'wall clock, no GPU'})"
    unit = "ms · FLOP/s · %peak" + ("  (memory-bound: ms · GB/s · %BW)" if mb_rows else "")
    mb = " [cyan](memory-bound)[/]"
    if compact(wide):
        console.print(escape(title), highlight=False)
        console.print(f"each cell: {unit}", highlight=False)
        width = max(map(len, backends_), default=0)
        for label, by in rows.items():
            console.print(escape(label) + (mb if label in mb_rows else ""), highlight=False)
            for b, r in by.items():
                console.print(f"  {escape(b.ljust(width))}  {cell(r)}", highlight=False)
        con = console
    else:
        t = RichTable(title=escape(title))
        t.add_column("configuration")
        for b in backends_:
            t.add_column(escape(f"{b}\n{unit.replace('  ', chr(10))}"), justify="right")
        for label, by in rows.items():
            t.add_row(escape(label) + (mb if label in mb_rows else ""),
                      *["" if by.get(b) is None else cell(by[b]) for b in backends_])
        con = table_console()
        con.print(t)
    print_footnotes(con, notes.lines())
    if mb_rows:
        con.print("memory-bound rows (decode: few queries against a long KV cache, intensity below the ridge) show "
                  "GB/s and % of " + (f"the {bw_source} bandwidth ({bw_tbps * 1000:.4g} GB/s)" if bw_tbps else
                                      "bandwidth (unknown here: run `attnlab ceilings`)") + " instead of TFLOP/s",
                  highlight=False)


_COLOUR = {"slower": "red", "failed": "red", "faster": "green"}


def _num(x) -> str:
    return "" if x is None else f"{x:.4g}"


def print_compare(rows, threshold: float, wide: bool = False) -> None:
    """``attnlab compare``'s rows (``sweep.compare.Row``): per cell A's and B's median ms with the
    [min, p75] spread of their repeats, B / A and the verdict."""
    title = f"B / A  (threshold {threshold:g}%; spread = [min, p75] of the repeats)"
    if not compact(wide):
        t = RichTable(title=escape(title))
        for c in ("configuration", "backend", "A ms", "A [min, p75]", "B ms", "B [min, p75]", "B/A", "note"):
            t.add_column(escape(c))
        span = lambda s: "" if s is None else escape(f"[{s[0]:.4g}, {s[1]:.4g}]")  # noqa: E731
        for r in rows:
            note = f"[{_COLOUR[r.verdict]}]{escape(r.note)}[/]" if r.verdict in _COLOUR else escape(r.note)
            t.add_row(escape(r.label), escape(r.backend), _num(r.a_ms), span(r.a_spread), _num(r.b_ms), span(r.b_spread),
                      _num(r.ratio), note)
        table_console().print(t)
        return
    console.print(escape(title), highlight=False)
    console.print(escape("a cell: A ms [min,p75] → B ms [min,p75]  ×B/A  verdict"), highlight=False)
    width = max((len(r.backend) for r in rows), default=0)
    by_label: dict[str, list] = {}
    for r in rows:
        by_label.setdefault(r.label, []).append(r)
    for label, cells in by_label.items():
        console.print(escape(label), highlight=False)
        for r in cells:
            note = escape(r.note)
            if r.verdict in _COLOUR:
                note = f"[{_COLOUR[r.verdict]}]{note}[/]"
            ratio = f"  ×{_g3(r.ratio)}" if r.ratio is not None else ""
            console.print(f"  {escape(r.backend.ljust(width))}  {escape(_side(r.a_ms, r.a_spread))} → "
                          f"{escape(_side(r.b_ms, r.b_spread))}{ratio}" + (f"  {note}" if note else ""), highlight=False)


def _g3(x: float) -> str:
    """3 significant digits, never an exponent: 0.0213, 1.39, 123, 4096."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _side(ms, spread) -> str:
    """One side of a compact compare line: "0.0311 [0.0213,0.036]" ("–" when not timed)."""
    if ms is None:
        return "–"
    return f"{_g3(ms)} [{_g3(spread[0])},{_g3(spread[1])}]" if spread else _g3(ms)
