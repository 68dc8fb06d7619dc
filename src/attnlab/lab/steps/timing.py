"""The timing step: kernel time and wall time side by side at the default shape (wall time alone where no GPU
times kernels), and what a blocked call's time holds."""
from __future__ import annotations

from .. import plots
from ..step_types import LabConfig, Step, Table, jax_side
from ..plan import perf_backends
from ..render_common import cells, fail_on_failed_cells, field_text, section_renderer, spread, status_or, timer_note

TITLE = "Timing at the default shape"


def sweeps(cfg: LabConfig) -> list:
    """The performance paths (``plan.perf_backends``) at the default shape, in the performance dtype."""
    Sweep = jax_side().Sweep
    c = cfg
    return [Sweep(perf_backends(c), dtype=[c.perf_dtype], batch=[c.batch], q_len=[c.q_len], heads=[c.heads],
                  head_dim=[c.head_dim], name="timing")]


def cells_note(cfg: LabConfig) -> str:
    return (f"Cells: {' and '.join(perf_backends(cfg))} at the default shape only — the question is what a blocked "
            "call's time holds at a small size, and these cells reappear in the sequence sweep.")


def _title(c: LabConfig) -> str:
    return f"{TITLE} (B={c.batch}, T={c.q_len}, N={c.heads}, H={c.head_dim})"


@section_renderer("timing", _title, needs=("timing",))
def render(s, p, records, cfg: LabConfig, plots_dir=None) -> None:
    recs = cells(records, "timing")
    kernel = any(r.get("kernel_ms") for r in recs)
    timed = (["kernel (CUPTI)", "kernel p25–p75"] if kernel else []) + ["wall per blocked call", "wall p25–p75",
                                                                          "pipelined wall"]
    columns = ["path", "dtype", *timed] + (["dispatch = wall − kernel"] if kernel else []) + ["compile s", "status"]
    spreads = {"kernel p25–p75": "kernel", "wall p25–p75": "wall"}
    rows = [[r["backend"], r["dtype"]] + [spread(r, spreads[c]) if c in spreads else field_text(r, c) for c in columns[2:-1]]
            + [status_or(r, "ok")] for r in recs]
    title = "Kernel time and wall time side by side" if kernel else "Wall time per call, no kernel time (it needs a GPU: CUPTI)"
    s.tables.append(Table(f"{title} (ms; median, and the 25th–75th percentile of the repeats)", columns, rows,
                          sources=list(recs)))
    ok = [r for r in recs if r["status"] == "ok"]
    if any(r["kernel_ms"] for r in ok):
        worst = max((r for r in ok if r["kernel_ms"]), key=lambda r: r["wall_ms"] / r["kernel_ms"])
        s.paragraphs.append(f"The lesson: at this size a blocked call's wall time is dispatch, not attention. "
                            f"{worst['backend']} {worst['dtype']}: kernels {worst['kernel_ms'] * 1e3:.1f} µs inside a "
                            f"{worst['wall_ms'] * 1e3:.1f} µs call ({worst['wall_ms'] / worst['kernel_ms']:.0f}×).")
    else:
        s.paragraphs.append("No GPU: only wall time can be measured here, and at this size it includes Python and "
                            "dispatch overhead. On an NVIDIA GPU the same step reports CUPTI kernel time beside it.")
    s.paragraphs.append(timer_note(recs))
    s.paragraphs.append(cells_note(cfg))
    if ok and plots_dir:
        labels = [f"{r['backend']} {r['dtype']}" for r in ok]
        s.plots.append(plots.bars(labels, [r["wall_ms"] for r in ok], plots.path_in(plots_dir, "timing_wall.png"),
                                  title="wall ms per blocked call (median; whiskers: 25th–75th percentile)", ylabel="ms",
                                  spread=[(r.get("wall_p25_ms"), r.get("wall_p75_ms")) for r in ok]))
        if any(r["kernel_ms"] for r in ok):
            s.plots.append(plots.bars(labels, [r["kernel_ms"] or 0 for r in ok], plots.path_in(plots_dir, "timing_kernel.png"),
                                      title="CUPTI kernel ms per call (median; whiskers: 25th–75th percentile)", ylabel="ms",
                                      spread=[(r.get("kernel_p25_ms"), r.get("kernel_p75_ms")) for r in ok]))
    s.facts = {f"{r['backend']}_{r['dtype']}": {"kernel_ms": r["kernel_ms"], "wall_ms": r["wall_ms"], "status": r["status"]} for r in recs}
    fail_on_failed_cells(s, recs)


STEP = Step("timing", TITLE, render, sweeps=sweeps, cells_note=cells_note)
