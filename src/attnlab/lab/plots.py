"""PNG plots of lab and sweep records (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..sweep.engine import time_ms  # noqa: E402


def _ok(records):
    return [r for r in records if r.get("status") == "ok" and time_ms(r)]


def _by_backend(records):
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["backend"], []).append(r)
    return out


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _timer_label(records):
    return "CUPTI kernel time" if any(r.get("kernel_ms") for r in records) else "wall clock (no GPU)"


def line_plot(records, x: str, y: str, path: str, *, title: str, xlabel: str, ylabel: str,
              logx=True, logy=True, hline: float | None = None, hline_label: str | None = None) -> str | None:
    """One line per backend of y (a record field or 'time') against x."""
    ok = _ok(records)
    if not ok:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for backend, recs in _by_backend(ok).items():
        recs = sorted(recs, key=lambda r: r[x])
        ys = [time_ms(r) if y == "time" else r[y] for r in recs]
        ax.plot([r[x] for r in recs], ys, marker="o", label=backend)
    if hline:
        ax.axhline(hline, color="grey", linestyle="--", label=hline_label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}\n({_timer_label(ok)})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, path)


def memory_plot(records, path: str, *, title: str) -> str | None:
    recs = [r for r in records if r.get("temp_bytes") is not None]
    if not recs:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for backend, rs in _by_backend(recs).items():
        rs = sorted(rs, key=lambda r: r["q_len"])
        ax.plot([r["q_len"] for r in rs], [max(r["temp_bytes"], 1) / 2**20 for r in rs], marker="o", label=backend)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T = S")
    ax.set_ylabel("compiled temp memory (MiB)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, path)


def roofline(records, path: str, *, peak_tflops: float | None, peak_tbps: float | None, title: str) -> str | None:
    ok = _ok(records)
    if not ok:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for backend, rs in _by_backend(ok).items():
        ax.scatter([r["intensity"] for r in rs], [r["tflops"] for r in rs], label=backend, s=18)
    xs = sorted(r["intensity"] for r in ok)
    if peak_tflops and peak_tbps:
        import numpy as np

        grid = np.logspace(np.log10(max(xs[0] / 4, 0.1)), np.log10(xs[-1] * 4), 100)
        ax.plot(grid, np.minimum(peak_tflops, grid * peak_tbps), color="grey", linestyle="--",
                label=f"roof: {peak_tflops:g} TFLOP/s, {peak_tbps * 1000:g} GB/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{title}\n({_timer_label(ok)})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def bars(labels, values, path: str, *, title: str, ylabel: str) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.bar(labels, values, color="#4a7ab5")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    for i, v in enumerate(values):
        ax.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom", fontsize=8)
    ax.tick_params(axis="x", labelrotation=20)
    return _save(fig, path)


def path_in(ctx_plots_dir: str, name: str) -> str:
    return os.path.join(ctx_plots_dir, name)
