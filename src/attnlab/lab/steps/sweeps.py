"""The sweeps step: the sequence-length and batch sweeps: time and FLOP/s against T and B, and the roofline."""
from __future__ import annotations

from ...core import device
from .. import plots
from ..plan import perf_backends
from ..render_common import cells, fail_on_failed_cells, section_renderer, sweep_table, timer_note
from ..step_types import LabConfig, LabContext, Step, jax_side

TITLE = "Sequence-length and batch sweeps"


def sweeps(cfg: LabConfig) -> list:
    Sweep = jax_side().Sweep
    c = cfg
    common = dict(heads=[c.heads], head_dim=[c.head_dim], dtype=[c.perf_dtype])
    return [Sweep(perf_backends(c), batch=[c.batch], q_len=c.seq_lens, name="seq_sweep", **common),
            Sweep(perf_backends(c), batch=c.batches, q_len=[c.batch_sweep_len], name="batch_sweep", **common)]


#: Sizes of the roofs measured in the run where neither a datasheet nor ``attnlab ceilings``' cache knows
#: the device (a CPU): ``attnlab ceilings``' CPU sizes (a 1024 × 1024 matmul, a 64 MiB copy) with fewer
#: repeats; ``--quick`` (a smoke test) a 512 × 512 matmul and a 4 MiB copy.
RUN_CEILINGS = {"repeats": 5}
QUICK_CEILINGS = {"matmul_n": 512, "copy_bytes": 2**22, "repeats": 3}


def probe(ctx: LabContext) -> dict:
    """The device's peak and roofs (the roofline plot's lines). Without a datasheet peak or cached
    ceilings (a CPU), the ceilings are measured here (``RUN_CEILINGS``; not saved to the cache)."""
    jx = jax_side()
    kind, dt, tf32 = device.current().kind, ctx.cfg.perf_dtype, jx.default_matmul_is_tf32()
    roof = jx.roofs(kind, dt, tf32)
    measured_here = None
    if not roof["datasheet"] and not roof["measured"]:
        measured_here = jx.measure_ceilings(**(QUICK_CEILINGS if ctx.cfg.quick else RUN_CEILINGS))
        roof["measured"] = (measured_here["matmul_tflops"], measured_here["copy_gbps"] / 1000)
    return {"device_kind": kind, "tf32": tf32, "peak_tflops": jx.peak_tflops(kind, dt, tf32=tf32), "roofs": roof,
            "ceilings_measured_here": measured_here and {k: measured_here[k] for k in ("matmul_dtype", "matmul_n", "copy_bytes")}}


def cells_note(cfg: LabConfig) -> str:
    c = cfg
    return (f"Cells: {' and '.join(perf_backends(c))} at T = {', '.join(map(str, c.seq_lens))} (enough to see the T² "
            f"growth and where FLOP/s level off) and at B = {', '.join(map(str, c.batches))} "
            f"(T = {c.batch_sweep_len}: does a larger batch fill the device?); the default shape's cells are "
            "the timing step's.")


@section_renderer("sweeps", TITLE, needs=("seq_sweep", "batch_sweep"))
def render(s, p, records, cfg: LabConfig, plots_dir=None) -> None:
    c, dt, p = cfg, cfg.perf_dtype, p or {}
    seq, bat = cells(records, "seq_sweep"), cells(records, "batch_sweep")
    TB = c.batch_sweep_len
    s.tables.append(sweep_table(seq, "q_len", f"Sequence sweep (B={c.batch}, N={c.heads}, H={c.head_dim}, {dt})"))
    s.tables.append(sweep_table(bat, "batch", f"Batch sweep (T=S={TB}, N={c.heads}, H={c.head_dim}, {dt})"))
    kind = p.get("device_kind", "this device")
    pk = p.get("peak_tflops")
    roof = p.get("roofs") or {"datasheet": None, "measured": None}
    datasheet = tuple(roof["datasheet"]) if roof.get("datasheet") else None
    measured = tuple(roof["measured"]) if roof.get("measured") else None
    if plots_dir:
        d = plots_dir
        for made in (
            plots.line_plot(seq, "q_len", "time", plots.path_in(d, "latency_vs_seq.png"), title="latency vs sequence length",
                            xlabel="T = S", ylabel="ms"),
            plots.line_plot(seq, "q_len", "tflops", plots.path_in(d, "tflops_vs_seq.png"), title="FLOP/s vs sequence length",
                            xlabel="T = S", ylabel="TFLOP/s", logy=False, hline=pk, hline_label=f"{kind} peak {pk} TFLOP/s" if pk else None),
            plots.line_plot(bat, "batch", "time", plots.path_in(d, "batch_sweep.png"), title=f"batch sweep at T = {TB}",
                            xlabel="batch", ylabel="ms"),
            plots.roofline(seq + bat, plots.path_in(d, "roofline.png"), datasheet=datasheet, measured=measured,
                           title=f"roofline ({kind})", group=lambda r: {"seq_sweep": "sequence sweep",
                                                                         "batch_sweep": "batch sweep"}.get(r.get("step"), "")),
        ):
            if made:
                s.plots.append(made)
    s.paragraphs.append(timer_note(seq))
    s.paragraphs.append(cells_note(c))
    here = p.get("ceilings_measured_here")
    if not datasheet:
        s.paragraphs.append(f"No datasheet peak is known for {kind}: the roofline draws "
                            + (f"the ceilings measured in this run (a {here['matmul_n']}×{here['matmul_n']} "
                               f"{here['matmul_dtype']} matmul and a copy moving {here['copy_bytes'] / 2**20:.0f} MiB; "
                               "`attnlab ceilings` measures larger ones and keeps them)." if measured and here else
                               "the measured ceilings of `attnlab ceilings` only." if measured else
                               "no roof (run `attnlab ceilings` to measure this device's and draw them)."))
    elif not measured:
        s.paragraphs.append("The roofline's measured roof is missing: run `attnlab ceilings` to draw it beside the datasheet's.")
    above = [r for r in seq + bat if measured and r["status"] == "ok" and r.get("tflops") and r.get("intensity")
             and r["tflops"] > min(measured[0], r["intensity"] * measured[1])]
    if above and not datasheet:
        s.paragraphs.append(f"{len(above)} of {len(seq + bat)} cells lie above the measured roof: a ceiling measured "
                            "once is a lower bound of the device's (a busy machine measures less); "
                            "`attnlab ceilings --force` measures it again.")
    best = {}
    for r in seq:
        if r["status"] == "ok":
            best[r["backend"]] = max(best.get(r["backend"], 0), r["tflops"])
    s.facts = {"best_tflops": best, "cells": len(seq) + len(bat),
               "failed_cells": sum(r["status"] != "ok" for r in seq + bat)}
    fail_on_failed_cells(s, seq + bat)


STEP = Step("sweeps", TITLE, render, sweeps=sweeps, probe=probe, cells_note=cells_note)
