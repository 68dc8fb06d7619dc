"""PNG plots of lab and sweep records (matplotlib, Agg backend: no display needed).

Timing plots show the spread of the repeats (25th-75th percentile whiskers around the median),
lines are told apart by marker and line style as well as colour, and titles say what was measured.
"""
from __future__ import annotations

import itertools
import math
import os
import textwrap

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

from ..core.records import time_ms, timing  # noqa: E402, F401 - JAX-free: the renderers plot from records alone

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")
#: Characters per title line (a 6.4-inch figure at font size 10); longer titles wrap.
TITLE_CHARS = 70
#: Factor between the x positions of coincident lines on a log axis (the memory plot).
NUDGE = 1.06


def _ok(records):
    return [r for r in records if r.get("status") == "ok" and time_ms(r)]


def _by_backend(records):
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["backend"], []).append(r)
    return out


def _styles():
    """(marker, linestyle) pairs, each backend its own."""
    return zip(itertools.cycle(MARKERS), itertools.cycle(LINESTYLES))


def save(fig, path):
    """Write ``fig`` to ``path`` (PNG, cropped to what it draws: ``tight_layout`` costs twice as much) and close it."""
    fig.savefig(path, dpi=90, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return path


def _timer_label(records):
    return "CUPTI kernel time" if any(r.get("kernel_ms") for r in records) else "wall clock (no GPU)"


def _flop_unit(tflops_values) -> tuple[float, str]:
    """(scale from TFLOP/s, unit) that fits: GFLOP/s where every value is below 1 TFLOP/s (a CPU)."""
    return (1e3, "GFLOP/s") if tflops_values and max(tflops_values) < 1 else (1.0, "TFLOP/s")


def line_plot(records, x: str, y: str, path: str, *, title: str, xlabel: str, ylabel: str,
              logx=True, logy=True, hline: float | None = None, hline_label: str | None = None) -> str | None:
    """One line per backend of y (a record field or 'time') against x; whiskers: the 25th-75th
    percentile of the repeats (for FLOP/s, the same spread of the time turned into FLOP/s)."""
    ok = _ok(records)
    if not ok:
        return None
    scale = 1.0
    if y == "tflops":
        scale, unit = _flop_unit([r["tflops"] for r in ok])
        ylabel = ylabel.replace("TFLOP/s", unit)
        if hline and scale != 1:
            hline = None   # a GPU's peak beside a CPU's GFLOP/s says nothing
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for (backend, recs), (marker, ls) in zip(_by_backend(ok).items(), _styles()):
        recs = sorted(recs, key=lambda r: r[x])
        xs = [r[x] for r in recs]
        if y in ("time", "tflops"):
            ts = [timing(r) for r in recs]
            med = [t["median"] for t in ts]
            lo, hi = [t["p25"] for t in ts], [t["p75"] for t in ts]
            if y == "tflops":   # FLOP/s = flops / time: the slow end of the spread is the low end
                med = [r["tflops"] * scale for r in recs]
                lo, hi = ([m * t["median"] / t["p75"] for m, t in zip(med, ts)],
                          [m * t["median"] / t["p25"] for m, t in zip(med, ts)])
            err = [[m - a for m, a in zip(med, lo)], [b - m for m, b in zip(med, hi)]]
            ax.errorbar(xs, med, yerr=err, marker=marker, linestyle=ls, capsize=3, label=backend)
        else:
            ax.plot(xs, [r[y] for r in recs], marker=marker, linestyle=ls, label=backend)
    if hline:
        ax.axhline(hline, color="grey", linestyle="--", label=hline_label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
        log_ticks(ax, "y")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    spread = "; whiskers: 25th–75th percentile of the repeats" if y in ("time", "tflops") else ""
    ax.set_title(f"{title}\n({_timer_label(ok)}{spread})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return save(fig, path)


def memory_plot(records, path: str, *, title: str) -> str | None:
    """Compiled temp bytes per backend against T; lines that coincide (naive and XLA often do)
    stay visible by marker, line style and a slight offset of the markers' size."""
    recs = [r for r in records if r.get("temp_bytes") is not None]
    if not recs:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    by = _by_backend(recs)
    for i, ((backend, rs), (marker, ls)) in enumerate(zip(by.items(), _styles())):
        rs = sorted(rs, key=lambda r: r["q_len"])
        nudge = NUDGE ** (i - (len(by) - 1) / 2)   # coincident lines side by side, not on top of each other
        ax.plot([r["q_len"] * nudge for r in rs], [max(r["temp_bytes"], 1) / 2**20 for r in rs], marker=marker,
                linestyle=ls, markersize=9 - 2 * (i % 3), fillstyle="full" if i % 2 == 0 else "none",
                linewidth=2.5 - 0.8 * (i % 2), label=backend)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    log_ticks(ax, "y")
    ax.set_xlabel("sequence length T = S" + (" (markers nudged apart where lines coincide)" if len(by) > 1 else ""))
    ax.set_ylabel("compiled temp memory (MiB)")
    ax.set_title(textwrap.fill(title, TITLE_CHARS), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return save(fig, path)


def roofline(records, path: str, *, datasheet: tuple[float, float] | None = None,
             measured: tuple[float, float] | None = None, title: str, group=None) -> str | None:
    """Achieved FLOP/s against arithmetic intensity; colour per backend, marker per ``group(record)``
    (the sweep a point belongs to). Roofs (TFLOP/s, TB/s): the datasheet's dashed, the measured
    ceilings' (``attnlab ceilings``) dotted, each labelled with its numbers."""
    ok = _ok(records)
    if not ok:
        return None
    group = group or (lambda r: "")
    scale, unit = _flop_unit([r["tflops"] for r in ok] + [roof[0] for roof in (datasheet, measured) if roof])
    fig, ax = plt.subplots(figsize=(6.4, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    groups = list(dict.fromkeys(group(r) for r in ok))
    for ci, (backend, rs) in enumerate(_by_backend(ok).items()):
        for gi, g in enumerate(groups):
            pts = [r for r in rs if group(r) == g]
            if pts:
                ax.scatter([r["intensity"] for r in pts], [r["tflops"] * scale for r in pts], s=24,
                           color=colours[ci % len(colours)], marker=MARKERS[gi % len(MARKERS)],
                           label=f"{backend} · {g}" if g else backend)
    xs = sorted(r["intensity"] for r in ok)

    grid = np.logspace(np.log10(max(xs[0] / 4, 0.1)), np.log10(xs[-1] * 4), 100)
    for roof, name, style in ((datasheet, "datasheet", "--"), (measured, "measured", ":")):
        if roof:
            tf, tb = roof
            ax.plot(grid, np.minimum(tf, grid * tb) * scale, color="grey" if name == "datasheet" else "black",
                    linestyle=style, label=f"{name} roof: {tf * scale:.4g} {unit}, {tb * 1000:.4g} GB/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    log_ticks(ax)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel(unit)
    ax.set_title(f"{title}\n({_timer_label(ok)})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)


def log_ticks(ax, axes: str = "xy") -> None:
    """Plain-number labels (20, 50, 100; not 2×10¹) on the log ``axes`` ("x", "y" or "xy"), as many per
    decade as fit: at 1, 2, 3 and 5 of each decade within 1.5 decades (a CPU's narrow range still gets
    several), 1, 2 and 5 within 3, else each power of ten."""
    for axis, (lo, hi) in [(a, lim) for name, a, lim in (("x", ax.xaxis, ax.get_xlim()), ("y", ax.yaxis, ax.get_ylim()))
                           if name in axes]:
        decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
        subs = (1.0, 2.0, 3.0, 5.0) if decades <= 1.5 else (1.0, 2.0, 5.0) if decades <= 3 else (1.0,)
        axis.set_major_locator(ticker.LogLocator(base=10, subs=subs, numticks=12))
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(ticker.NullFormatter())


def bars(labels, values, path: str, *, title: str, ylabel: str, spread=None) -> str:
    """A bar per value; ``spread`` [(low, high), ...] draws whiskers (the repeats' 25th-75th percentile)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    yerr = None
    if spread and all(lo is not None and hi is not None for lo, hi in spread):
        yerr = [[max(0.0, v - lo) for v, (lo, _) in zip(values, spread)], [max(0.0, hi - v) for v, (_, hi) in zip(values, spread)]]
    ax.bar(labels, values, color="#4a7ab5", yerr=yerr, capsize=4 if yerr else 0)
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title, TITLE_CHARS), fontsize=10)
    tops = [v + (yerr[1][i] if yerr else 0.0) for i, v in enumerate(values)]
    for i, v in enumerate(values):   # above the whisker's top, never on it
        ax.annotate(f"{v:.3g}", (i, tops[i]), ha="center", va="bottom", fontsize=8, xytext=(0, 3),
                    textcoords="offset points")
    ax.set_ylim(0, max(tops, default=1.0) * 1.15 or 1.0)
    ax.tick_params(axis="x", labelrotation=20)
    return save(fig, path)


def path_in(ctx_plots_dir: str, name: str) -> str:
    return os.path.join(ctx_plots_dir, name)
