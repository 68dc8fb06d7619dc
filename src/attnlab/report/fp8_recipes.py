"""Issue 15's FP8 study read back: the grid, and from its records the table, the goals and the plot (no JAX).

The grid: every ``cudnn-fp8*`` recipe + ``cudnn`` (the bf16 anchor) x inputs {gaussian, outliers,
channel-outliers, shifted-keys} x T = S in {16384, 4096} x causal {False, True}; B=1, N=K=16, H=128,
bf16 in, forward (benchmarks/fp8/recipes.py measures it through the sweep engine).

FP8 cells are judged at the backend's rel L2 limit (0.1): a recipe beyond it is ``incorrect`` and
untimed (its error is still recorded: a finding). The error column is ``rel_err_f64``, rel L2 of the
output against NumPy float64 attention on sampled rows (``attnlab.measure.check``); speed is
``tflops`` (non-causal FLOPs 4 B N T S H, causal about half, per CUPTI kernel time).

Goals (issue 15, item 4), evaluated by ``goals``: gaussian, T=16k non-causal: some FP8 recipe at
<= 3% rel L2 and >= 1000 TFLOP/s; outliers and channel-outliers: the best recipe among those at most
5% slower than ``cudnn-fp8`` (per-tensor amax) has >= 2.5x lower error than it.
"""
from __future__ import annotations

import json
import os

from ..core.records import time_ms

#: The grid measured by benchmarks/fp8/recipes.py; the report reads these backends only.
RECIPES = ["cudnn-fp8", "cudnn-fp8-unit", "cudnn-fp8-pow2", "cudnn-fp8-s256", "cudnn-fp8-s1", "cudnn-fp8-hadamard",
           "cudnn-fp8-hadamard-f32", "cudnn-fp8-hadamard-fused", "cudnn-fp8-smoothk", "cudnn-fp8-hadamard-smoothk"]
ANCHOR = "cudnn"
BACKENDS = [ANCHOR] + RECIPES
INPUTS = ["gaussian", "outliers", "channel-outliers", "shifted-keys"]
#: (T, causal) in the order measured: the goal shape first.
SHAPES = [(16384, False), (16384, True), (4096, False), (4096, True)]
GOAL_SHAPE = (16384, False)
GAUSSIAN_MAX_ERR, GAUSSIAN_MIN_TFLOPS = 0.03, 1000.0
OUTLIER_GAIN, SPEED_COST = 2.5, 0.05


def load(path: str) -> list[dict]:
    """The records of the grid's backends in a results.jsonl (a torn last line skipped)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue   # a torn last line
                if r.get("backend") in BACKENDS:
                    out.append(r)
    return out


def _key(r) -> tuple:
    return (r.get("inputs", "gaussian"), r["q_len"], bool(r["causal"]))


def _index(recs) -> dict:
    return {(_key(r), r["backend"]): r for r in recs}


def _ms(r):
    return time_ms(r)


def _err(r):
    return r.get("rel_err_f64") if r.get("rel_err_f64") is not None else r.get("rel_err")


def _cell(r) -> str:
    if r is None:
        return ""
    err = _err(r)
    e = f"{100 * err:.2f}%" if err is not None else "–"
    if r["status"] in ("ok", "unchecked") and r.get("tflops"):
        return f"{e} · {r['tflops']:.0f}"
    return f"{e} · ✗ {r['status']}" if err is not None else f"✗ {r['status']}"


def table(recs) -> list[str]:
    """Markdown: rows inputs x T x causal, columns backends, cells 'rel L2 vs float64 % · TFLOP/s'."""
    idx = _index(recs)
    names = [b for b in BACKENDS if any(r["backend"] == b for r in recs)]
    lines = ["rel L2 vs float64 (sampled rows) · TFLOP/s (CUPTI kernel time); ✗ = not timed (status in the record; "
             "FP8 limit rel L2 0.1)", "",
             "| inputs | T=S | causal | " + " | ".join(n.removeprefix("cudnn-fp8-") if n.startswith("cudnn-fp8-") else n
                                                      for n in names) + " |",
             "|" + " --- |" * (len(names) + 3)]
    keys = sorted({_key(r) for r in recs}, key=lambda k: (INPUTS.index(k[0]) if k[0] in INPUTS else 99, -k[1], k[2]))
    for k in keys:
        lines.append(f"| {k[0]} | {k[1]} | {'yes' if k[2] else 'no'} | "
                     + " | ".join(_cell(idx.get((k, n))) for n in names) + " |")
    return lines


def recipe_ms(idx, key, name: str = "cudnn-fp8") -> tuple[float | None, str]:
    """(``name``'s kernel ms on ``key``, where it comes from). A cell beyond the FP8 limit is not timed
    (issue 11: an incorrect cell is never timed); FP8 kernel time and the recipes' own passes do not
    depend on the values, so the same backend's gaussian time of the same shape stands in."""
    r = idx.get((key, name))
    if r is not None and r["status"] == "ok" and _ms(r):
        return _ms(r), ""
    g = idx.get((("gaussian",) + tuple(key[1:]), name))
    if g is not None and g["status"] == "ok" and _ms(g):
        return _ms(g), " (gaussian time: own cell not timed)"
    return None, " (not timed)"


def amax_ms(idx, key) -> tuple[float | None, str]:
    """``recipe_ms`` of ``cudnn-fp8`` (per-tensor amax)."""
    return recipe_ms(idx, key, "cudnn-fp8")


def best_recipe(idx, key, *, within: float | None = SPEED_COST):
    """(name, record, ms) of the lowest-error FP8 recipe on ``key`` whose time (``recipe_ms``) is at most
    ``within`` slower than ``cudnn-fp8``'s (``within=None``: any time); None when there is none.
    Errors count whatever the status: an incorrect cell still records its error."""
    base, _ = amax_ms(idx, key)
    cands = []
    for n in RECIPES:
        r = idx.get((key, n))
        ms, _ = recipe_ms(idx, key, n)
        if r is None or _err(r) is None or ms is None:
            continue
        if within is not None and base and ms > (1 + within) * base:
            continue
        cands.append((n, r, ms))
    return min(cands, key=lambda c: _err(c[1])) if cands else None


def goals(recs) -> list[str]:
    """Issue 15's goals, each met or MISSED with its numbers."""
    idx = _index(recs)
    T, causal = GOAL_SHAPE
    out = [f"**Goals (issue 15, item 4; T=S={T}, non-causal, B=1, N=16, H=128, bf16 in)**", ""]
    g = ("gaussian", T, causal)
    cands = [(n, idx[(g, n)]) for n in RECIPES if (g, n) in idx and idx[(g, n)]["status"] == "ok"]
    hits = [(n, r) for n, r in cands if _err(r) <= GAUSSIAN_MAX_ERR and (r.get("tflops") or 0) >= GAUSSIAN_MIN_TFLOPS]
    if not cands:
        out.append("- gaussian: no timed FP8 record")
    else:
        n, r = min(hits or cands, key=lambda nr: _err(nr[1]))
        fast = max(cands, key=lambda nr: nr[1].get("tflops") or 0)
        out.append(f"- gaussian <= {100 * GAUSSIAN_MAX_ERR:.0f}% rel L2 at >= {GAUSSIAN_MIN_TFLOPS:.0f} TFLOP/s: "
                   f"{'met' if hits else 'MISSED'}: lowest error {n} {100 * _err(r):.2f}% at {r.get('tflops') or 0:.0f} "
                   f"TFLOP/s; fastest {fast[0]} {fast[1].get('tflops') or 0:.0f} TFLOP/s at {100 * _err(fast[1]):.2f}%")
    for dist in ("outliers", "channel-outliers"):
        for (t, c) in SHAPES:
            key = (dist, t, c)
            amax = idx.get((key, "cudnn-fp8"))
            if amax is None or _err(amax) is None:
                if (t, c) == GOAL_SHAPE:
                    out.append(f"- {dist} T={t}{' causal' if c else ''}: no cudnn-fp8 (amax) record")
                continue
            where = f"{dist} T={t}{' causal' if c else ''}"
            base, note = amax_ms(idx, key)
            for label, best in (("lowest error", best_recipe(idx, key, within=None)),
                                (f"lowest error at <= {100 * SPEED_COST:.0f}% cost", best_recipe(idx, key))):
                if best is None:
                    out.append(f"- {where}, {label}: no recipe with an error and a time")
                    continue
                n, r, ms = best
                gain = _err(amax) / _err(r) if _err(r) else float("inf")
                cost = 100 * (ms / base - 1) if base else None
                met = gain >= OUTLIER_GAIN and cost is not None and cost <= 100 * SPEED_COST
                why = [] if met else [w for w, bad in ((f"error gain {gain:.2f}x < {OUTLIER_GAIN:g}x", gain < OUTLIER_GAIN),
                                                      (f"time {cost:+.1f}% > {100 * SPEED_COST:.0f}%" if cost is not None
                                                       else "time unknown", cost is None or cost > 100 * SPEED_COST)) if bad]
                out.append(f"- {where}, {label}: {n} {100 * _err(r):.2f}% vs amax {100 * _err(amax):.2f}% "
                           f"({gain:.2f}x lower), time {'?' if cost is None else f'{cost:+.1f}%'} vs amax{note}: "
                           f"{'met' if met else 'MISSED (' + '; '.join(why) + ')'}")
    anchor = idx.get((g, ANCHOR))
    if anchor is not None and anchor["status"] == "ok":
        out.append(f"- anchor: bf16 cudnn on gaussian {100 * _err(anchor):.2f}% at {anchor.get('tflops') or 0:.0f} TFLOP/s")
    return out


def plot(recs, path: str) -> str | None:
    """PNG: rel L2 vs float64 (log) against TFLOP/s, one panel per inputs, one marker per backend."""
    import matplotlib  # heavy: matplotlib, loaded when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib, loaded when a plot is drawn

    MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h")   # attnlab.lab.plots' markers (+1)
    idx = _index(recs)

    def speed(r):   # (TFLOP/s, measured here?): an untimed FP8 cell takes its gaussian twin's speed (see recipe_ms)
        if r["status"] == "ok" and r.get("tflops"):
            return r["tflops"], True
        g = idx.get((("gaussian",) + tuple(_key(r)[1:]), r["backend"]))
        return (g["tflops"], False) if g is not None and g["status"] == "ok" and g.get("tflops") else (None, False)

    pts = [(r, *speed(r)) for r in recs if _err(r)]
    pts = [(r, t, own) for r, t, own in pts if t]
    if not pts:
        return None
    dists = [d for d in INPUTS if any(r.get("inputs", "gaussian") == d for r, _, _ in pts)]
    from matplotlib.ticker import FormatStrFormatter, NullFormatter  # heavy: matplotlib, loaded when a plot is drawn

    colours = plt.get_cmap("tab10").colors
    fig, axes = plt.subplots(1, len(dists), figsize=(4.2 * len(dists), 4.2), squeeze=False)
    handles = {}
    for ax, d in zip(axes[0], dists):
        for i, b in enumerate(BACKENDS):   # one marker and colour per backend, the same in every panel
            for own in (True, False):      # hollow: not timed (over the FP8 limit), its gaussian twin's speed
                rs = [(r, t) for r, t, o in pts if o == own and r["backend"] == b and r.get("inputs", "gaussian") == d]
                if not rs:
                    continue
                c = colours[i % len(colours)]
                h = ax.scatter([t for _, t in rs], [100 * _err(r) for r, _ in rs], marker=MARKERS[i % len(MARKERS)],
                               s=[46 if r["q_len"] >= 16384 else 22 for r, _ in rs], label=b, alpha=0.85,
                               **({"color": c} if own else {"facecolors": "none", "edgecolors": c}))
                if own or b not in handles:
                    handles[b] = h
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"inputs = {d}")
        ax.set_xlabel("TFLOP/s (CUPTI kernel time)")
        ax.set_ylabel("rel L2 vs float64 (%)")
        ax.axhline(100 * GAUSSIAN_MAX_ERR, color="grey", lw=0.8, ls=":")
        ax.grid(True, which="both", alpha=0.3)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(5, len(handles)), fontsize=7)
    fig.suptitle("FP8 recipes vs bf16 cuDNN: error against speed (large markers: T=16k, small: T=4k; "
                 "dotted: the 3% goal; hollow: over the FP8 limit, not timed, at its gaussian twin's speed)", fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def report(path: str, plot_path: str | None = None) -> str:
    recs = load(path)
    plot_path = plot_path or os.path.join(os.path.dirname(os.path.abspath(path)), "fp8_recipes.png")
    png = plot(recs, plot_path)
    lines = table(recs) + [""] + goals(recs)
    if png:
        lines += ["", f"plot: {png}"]
    return "\n".join(lines)
