"""The lab's sections from records: one pure renderer per step, ``render(records, cfg, plots_dir) -> Section``.

Pure: no JAX is imported here (nor by anything this imports), nothing is measured. A renderer
takes the run's records (the lines of results.jsonl: cell records tagged with their ``step``,
``memory`` records, and each probing step's ``lab_step`` record with its ``probe`` facts) and
the ``LabConfig``, and draws its plots from those records into ``plots_dir`` (none when None).
``render_all(records, cfg)`` renders a stored run again::

    from attnlab.lab.render import render_all
    from attnlab.core.store import read_records
    sections = render_all(read_records("attnlab-out/results.jsonl"), cfg)
"""
from __future__ import annotations

import os

from . import plots
from .core import LabConfig, Section, Table
from .decode import render_decode
from .plan import cells_note, fp8_seqs, gqa_cells, gqa_shape, memory_backends, memory_seqs, perf_backends  # noqa: F401
from .plots import time_ms
from .render_common import (ITEMSIZE, NO_CUPTI, SPREAD_NOTE, TITLES, _missing, _plot, cells, fmt, probe,  # noqa: F401
                            spread, status_or, sweep_table, time_text, timer_note)
from .render_gqa import render_gqa


# --- the basics (probes) -------------------------------------------------------------------------

def render_environment(records, cfg: LabConfig, plots_dir=None) -> Section:
    p = probe(records, "environment")
    s = Section("environment", TITLES["environment"])
    if p is None:
        return _missing("environment", s.title)
    e = p["env"]
    s.paragraphs.append(f"JAX {e['jax']} (jaxlib {e['jaxlib']}) on {e['device_count']} × {e['device_kind']} "
                        f"({e['platform']}); cuDNN {e['cudnn'] or 'not loaded'}.")
    if e.get("gpu_note"):
        s.paragraphs.append(e["gpu_note"] + ".")
    rows = p["backends"]
    here = [r for r in rows if r[1] == "yes"]
    s.tables.append(Table(f"Backends available here ({len(here)} of {len(rows)}; input {cfg.batch}×{cfg.q_len}×"
                          f"{cfg.heads}×{cfg.head_dim} bf16)", ["backend", "runs this input", "why not this input", "what"],
                          [[r[0], r[3], r[4], r[5]] for r in here]))
    by_reason: dict[str, list[str]] = {}
    for r in rows:
        if r[1] != "yes":
            by_reason.setdefault(r[2] or "not available", []).append(r[0])
    if by_reason:
        s.folds.append((f"{len(rows) - len(here)} backends not available here, by reason",
                        [f"{why}: {', '.join(names)}" for why, names in by_reason.items()]))
    s.tables.append(Table("Optional libraries", ["library", "version"],
                          [[k, v or "not installed"] for k, v in e["optional"].items()]))
    s.facts = {"platform": e["platform"], "device_kind": e["device_kind"], "cudnn": e["cudnn"],
               "backends_available": [r[0] for r in rows if r[1] == "yes"]}
    return s


def render_qkv(records, cfg: LabConfig, plots_dir=None) -> Section:
    p = probe(records, "qkv")
    s = Section("qkv", TITLES["qkv"])
    if p is None:
        return _missing("qkv", s.title)
    s.paragraphs.append("Layout BTNH for the query and BSKH for key and value: batch, sequence, heads, head dim. "
                        "Inputs are drawn from a standard normal distribution (never zeros, which hide bugs).")
    ts = p["tensors"]
    s.tables.append(Table("Inputs", ["tensor", "shape", "dtype", "layout", "mean", "std"],
                          [[t["name"], str(tuple(t["shape"])), t["dtype"], t["layout"], f"{t['mean']:+.3f}", f"{t['std']:.3f}"]
                           for t in ts]))
    s.facts = {"shape_q": list(ts[0]["shape"]), "dtype": ts[0]["dtype"]}
    return s


def render_naive(records, cfg: LabConfig, plots_dir=None) -> Section:
    p = probe(records, "naive")
    s = Section("naive", TITLES["naive"])
    if p is None:
        return _missing("naive", s.title)
    s.paragraphs.append("Four steps: scores = QKᵀ, scale by 1/√H and softmax in float32, weight the values, "
                        "return in the input dtype. Checked against attnlab's NumPy float64 reference.")
    s.tables.append(Table("Naive attention", ["output shape", "dtype", "rel L2 vs float64", "limit", "correct"],
                          [[str(tuple(p["shape"])), p["dtype"], f"{p['rel_err']:.2e}", f"{p['limit']:.0e}", "yes" if p["ok"] else "NO"]]))
    s.facts = {"rel_err": p["rel_err"], "correct": p["ok"]}
    if not p["ok"]:
        s.status, s.reason = "failed", f"naive attention is wrong: {p['rule']}, got {p['rel_err']:.2e}"
    return s


def render_jax_nn(records, cfg: LabConfig, plots_dir=None) -> Section:
    p = probe(records, "jax_nn")
    s = Section("jax_nn", TITLES["jax_nn"])
    if p is None:
        return _missing("jax_nn", s.title)
    s.paragraphs.append("jax.nn.dot_product_attention with its default implementation=None runs XLA, not cuDNN; "
                        "the lowered program shows which kernel ran.")
    s.tables.append(Table("jax.nn default vs naive (float32)", ["max |diff|", "allclose (1e-5)", "kernel"],
                          [[f"{p['max_abs_diff']:.2e}", "yes" if p["allclose"] else "no",
                            "cuDNN fused attention" if p["cudnn_in_hlo"] else "XLA (no __cudnn$fmha call)"]]))
    s.facts = {"max_abs_diff": p["max_abs_diff"], "allclose": p["allclose"], "cudnn_in_hlo": p["cudnn_in_hlo"]}
    return s


def render_cudnn(records, cfg: LabConfig, plots_dir=None) -> Section:
    p = probe(records, "cudnn")
    s = Section("cudnn", TITLES["cudnn"])
    if p is None:
        return _missing("cudnn", s.title)
    if p.get("why"):
        s.status, s.reason = "skipped", f"cudnn: {p['why']}"
        s.paragraphs.append(f"The cuDNN probe says: {p['why']}.")
        s.facts = {"cudnn_available": False}
        return s
    c, x = p["cudnn"], p["xla"]
    s.tables.append(Table("cuDNN vs XLA in bfloat16", ["path", "rel L2 vs float64", "limit", "correct", "kernel"],
                          [["cudnn", f"{c['rel_err']:.2e}", f"{c['limit']:.1e}", "yes" if c["ok"] else "NO",
                            "__cudnn$fmha" if p["cudnn_in_hlo"] else "NOT cuDNN"],
                           ["xla", f"{x['rel_err']:.2e}", f"{x['limit']:.1e}", "yes" if x["ok"] else "NO", "XLA"]]))
    s.paragraphs.append(f"max |cuDNN − XLA| = {p['max_abs_diff']:.3e}.")
    s.facts = {"cudnn_available": True, "cudnn_in_hlo": p["cudnn_in_hlo"], "rel_err_cudnn": c["rel_err"],
               "rel_err_xla": x["rel_err"], "max_abs_diff_cudnn_xla": p["max_abs_diff"]}
    if not (p["cudnn_in_hlo"] and c["ok"]):
        s.status, s.reason = "failed", "cuDNN did not run" if not p["cudnn_in_hlo"] else "cuDNN output incorrect"
    return s


def render_causal(records, cfg: LabConfig, plots_dir=None) -> Section:
    p = probe(records, "causal")
    s = Section("causal", TITLES["causal"])
    if p is None:
        return _missing("causal", s.title)
    d0, dl = p["diff_pos0"], p["diff_last"]
    s.paragraphs.append("With is_causal=True query t sees keys s ≤ t. Position 0 sees only itself, so it differs "
                        "greatly from unmasked attention; the last position sees every key, so it hardly differs.")
    s.tables.append(Table("Causal vs unmasked", ["position", "max |causal − unmasked|"],
                          [["0", f"{d0:.3e}"], [str(cfg.q_len - 1), f"{dl:.3e}"]]))
    s.tables.append(Table("Causal vs float64 reference", ["rel L2", "limit", "correct"],
                          [[f"{p['rel_err']:.2e}", f"{p['limit']:.0e}", "yes" if p["correct"] else "NO"]]))
    s.facts = {"diff_pos0": d0, "diff_last": dl, "rel_err": p["rel_err"], "correct": p["correct"]}
    if not p["correct"] or not (d0 > 100 * max(dl, 1e-7)):
        s.status, s.reason = "failed", "causal output wrong or its effect not as expected"
    return s


# --- the measuring steps (sweeps) ----------------------------------------------------------------

def render_timing(records, cfg: LabConfig, plots_dir=None) -> Section:
    c = cfg
    recs = cells(records, "timing")
    s = Section("timing", f"7. Timing at the default shape (B={c.batch}, T={c.q_len}, N={c.heads}, H={c.head_dim})")
    if not recs:
        return _missing("timing", s.title)
    s.tables.append(Table("Kernel time and wall time side by side (ms; median, and the 25th–75th percentile of the repeats)",
                          ["path", "dtype", "kernel (CUPTI)", "kernel p25–p75", "wall per blocked call", "wall p25–p75",
                           "pipelined wall", "dispatch = wall − kernel", "compile s", "status"],
                          [[r["backend"], r["dtype"], fmt(r["kernel_ms"]), spread(r, "kernel"), fmt(r["wall_ms"]),
                            spread(r, "wall"), fmt(r["pipelined_ms"]), fmt(r["dispatch_ms"]), fmt(r["compile_s"], ".3g"),
                            status_or(r, "ok")] for r in recs],
                          empty_why={"kernel (CUPTI)": NO_CUPTI, "kernel p25–p75": NO_CUPTI, "dispatch = wall − kernel": NO_CUPTI}))
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
    s.paragraphs.append(cells_note("timing", c))
    if ok and plots_dir:
        labels = [f"{r['backend']} {r['dtype']}" for r in ok]
        s.plots.append(plots.bars(labels, [r["wall_ms"] for r in ok], _plot(plots_dir, "timing_wall.png"),
                                  title="wall ms per blocked call (median; whiskers: 25th–75th percentile)", ylabel="ms",
                                  spread=[(r.get("wall_p25_ms"), r.get("wall_p75_ms")) for r in ok]))
        if any(r["kernel_ms"] for r in ok):
            s.plots.append(plots.bars(labels, [r["kernel_ms"] or 0 for r in ok], _plot(plots_dir, "timing_kernel.png"),
                                      title="CUPTI kernel ms per call (median; whiskers: 25th–75th percentile)", ylabel="ms",
                                      spread=[(r.get("kernel_p25_ms"), r.get("kernel_p75_ms")) for r in ok]))
    s.facts = {f"{r['backend']}_{r['dtype']}": {"kernel_ms": r["kernel_ms"], "wall_ms": r["wall_ms"], "status": r["status"]} for r in recs}
    return s


def render_sweeps(records, cfg: LabConfig, plots_dir=None) -> Section:
    c = cfg
    dt = c.perf_dtype
    s = Section("sweeps", TITLES["sweeps"])
    seq, bat = cells(records, "seq_sweep"), cells(records, "batch_sweep")
    p = probe(records, "sweeps") or {}
    if not seq and not bat:
        return _missing("sweeps", s.title)
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
    s.paragraphs.append(cells_note("sweeps", c))
    if not datasheet:
        s.paragraphs.append(f"No datasheet peak is known for {kind}: the roofline draws "
                            + ("the measured ceilings of `attnlab ceilings` only." if measured else
                               "no roof (run `attnlab ceilings` to measure this device's and draw them)."))
    elif not measured:
        s.paragraphs.append("The roofline's measured roof is missing: run `attnlab ceilings` to draw it beside the datasheet's.")
    best = {}
    for r in seq:
        if r["status"] == "ok":
            best[r["backend"]] = max(best.get(r["backend"], 0), r["tflops"])
    s.facts = {"best_tflops": best, "cells": len(seq) + len(bat),
               "failed_cells": sum(r["status"] != "ok" for r in seq + bat)}
    return s


#: Inputs the lab's FP8-recipe sweep draws (``attnlab.reference.distributions``): plain, and outlier channels.
FP8_RECIPE_INPUTS = ("gaussian", "channel-outliers")
#: The best recipe is the lowest-error one among those at most this much slower than the fastest FP8 recipe.
FP8_BEST_WITHIN = 0.05


def fp8_recipe_names(names) -> list[str]:
    """The cuDNN FP8 recipe backends (``cudnn-fp8``, ``cudnn-fp8-*``) among ``names``, in order."""
    return [n for n in names if n == "cudnn-fp8" or n.startswith("cudnn-fp8-")]


def best_fp8_recipe(recs: list[dict]) -> dict | None:
    """Of the timed FP8 recipe records of one shape and inputs: the lowest rel L2 vs float64 among those
    at most ``FP8_BEST_WITHIN`` slower than the fastest one (None when none was timed)."""
    ok = [r for r in recs if r["backend"] != "cudnn" and r["status"] == "ok" and time_ms(r)]
    if not ok:
        return None
    fastest = min(time_ms(r) for r in ok)
    near = [r for r in ok if time_ms(r) <= (1 + FP8_BEST_WITHIN) * fastest]
    return min(near, key=lambda r: r.get("rel_err_f64") if r.get("rel_err_f64") is not None else r["rel_err"])


def _err_pct(r) -> str:
    e = r.get("rel_err_f64") if r.get("rel_err_f64") is not None else r.get("rel_err")
    return "–" if e is None else f"{100 * e:.2f}%"


def _lowest_error_note(recs: list[dict]) -> str:
    """'; lowest error X e% against per-tensor amax's a% (g x lower)' over the FP8 recipes measured."""
    errs = {r["backend"]: r.get("rel_err_f64") or r.get("rel_err") for r in recs if r["backend"] != "cudnn"}
    errs = {n: e for n, e in errs.items() if e}
    if not errs:
        return ""
    n = min(errs, key=errs.get)
    amax = errs.get("cudnn-fp8")
    gain = f" against per-tensor amax's {100 * amax:.2f}% ({amax / errs[n]:.1f}x lower)" if amax else ""
    return f"; lowest error {n} {100 * errs[n]:.2f}%{gain}"


def _fp8_recipes(records, p: dict, s: Section) -> None:
    """Step 10's recipe table (rows: recipes, columns: inputs) and, per inputs, the best recipe and its cost."""
    why = p.get("recipes_why") or {}
    if why and all(why.values()):
        first = next(iter(why.values()))
        s.paragraphs.append(f"FP8 recipes ({', '.join(why)}): skipped — {first}.")
        return
    recs = cells(records, "fp8-recipes")
    if not recs:
        return
    T = recs[0]["q_len"]
    dists = [d for d in FP8_RECIPE_INPUTS if any(r.get("inputs", "gaussian") == d for r in recs)]
    names = list(dict.fromkeys(r["backend"] for r in recs))
    by = {(r["backend"], r.get("inputs", "gaussian")): r for r in recs}
    rows = []
    for n in names:
        row = [n]
        for d in dists:
            r = by.get((n, d))
            row.append("" if r is None else f"{_err_pct(r)} · " + (f"{time_ms(r):.4g} ms" if r["status"] == "ok" else r["status"]))
        rows.append(row)
    s.tables.append(Table(f"FP8 recipes vs bf16 cuDNN (T=S={T}, causal, H=128): rel L2 vs float64 · time",
                          ["backend"] + [f"inputs = {d}" for d in dists], rows))
    for d in dists:
        best = best_fp8_recipe([r for r in recs if r.get("inputs", "gaussian") == d])
        anchor = by.get(("cudnn", d))
        if best is None:
            s.paragraphs.append(f"On {d} inputs no FP8 recipe was timed (each over the FP8 limit)"
                                + _lowest_error_note([r for r in recs if r.get("inputs", "gaussian") == d]) + ".")
            continue
        cost = ""
        if anchor is not None and anchor["status"] == "ok":
            e8 = best.get("rel_err_f64") or best["rel_err"]
            e16 = anchor.get("rel_err_f64") or anchor["rel_err"]
            cost = (f"; bf16 cuDNN: {_err_pct(anchor)} at {time_ms(anchor):.4g} ms, so FP8 is "
                    f"{time_ms(anchor) / time_ms(best):.2f}x as fast at {e8 / e16:.1f}x the error" if e16 else "")
        s.paragraphs.append(f"Best FP8 recipe on {d} inputs (lowest error among the recipes within "
                            f"{100 * FP8_BEST_WITHIN:.0f}% of the fastest): {best['backend']}, {_err_pct(best)} at "
                            f"{time_ms(best):.4g} ms{cost}.")


def render_te_fp8(records, cfg: LabConfig, plots_dir=None) -> Section:
    c = cfg
    s = Section("te_fp8", TITLES["te_fp8"])
    p = probe(records, "te_fp8")
    if p is None:
        return _missing("te_fp8", s.title)
    te_why = p["te_why"]
    if te_why:
        s.paragraphs.append(f"TransformerEngine: skipped — {te_why}.")
    else:
        recs = cells(records, "te")
        shape = f"B={c.batch}, N={c.heads}, H={c.head_dim}, bf16, no mask"
        s.tables.append(sweep_table(recs, "q_len", f"TransformerEngine DotProductAttention vs XLA vs cuDNN ({shape})"))
        made = plots_dir and plots.line_plot(recs, "q_len", "time", plots.path_in(plots_dir, "te_latency.png"),
                                             title=f"TransformerEngine vs XLA vs cuDNN ({shape})", xlabel="T = S", ylabel="ms")
        if made:
            s.plots.append(made)
    fp8 = cells(records, "fp8")
    fp8_rows, te8_facts = [], []
    for name, why in p["fp8_why"].items():
        if why:
            fp8_rows.append([name, "", f"skipped: {why}", "", "", "", "", ""])
            continue
        for T in fp8_seqs(c):
            r8 = next((r for r in fp8 if r["backend"] == name and r["q_len"] == T), None)
            r16 = next((r for r in fp8 if r["backend"] == "cudnn" and r["q_len"] == T), None)
            if r8 is None or r16 is None:
                continue
            sp = time_ms(r16) / time_ms(r8) if r8["status"] == "ok" and r16["status"] == "ok" else None
            facts = r8.get("facts") or {}
            if name == "te-fp8" and "fp8_in_program" in facts:
                te8_facts.append((T, facts))
            engaged = {True: "yes", False: "no"}.get(facts.get("fp8_in_program"), "yes" if name == "cudnn-fp8" else "")
            fp8_rows.append([name, f"T=S={T}", "ok" if r8["status"] == "ok" else status_or(r8, ""),
                             time_text(r8) if r8["status"] == "ok" else "", fmt(r8["rel_err"], ".2e"), engaged,
                             status_or(r16, f"{time_ms(r16):.4g} ms") + f" (rel L2 {fmt(r16['rel_err'], '.2e')})", fmt(sp, ".2f")])
    s.tables.append(Table("FP8 attention (bf16 in and out, causal, H=128)",
                          ["path", "shape", "status", "FP8 time", "FP8 rel L2 vs float64", "FP8 in the program",
                           "cuDNN bf16", "speed-up"], fp8_rows,
                          empty_why={col: "nothing ran: no FP8 path is available here" for col in
                                     ("shape", "FP8 time", "FP8 rel L2 vs float64", "FP8 in the program", "cuDNN bf16", "speed-up")}))
    if te8_facts:
        yn = {True: "yes", False: "no", None: "not compared"}
        s.paragraphs.append("Measured in this run: under te.autocast (DelayedScaling) TransformerEngine's DotProductAttention "
                            + "; ".join(f"at T={T} has FP8 in its compiled program: {yn[f['fp8_in_program']]}, output "
                                        f"bit-identical to plain 'te': {yn[f.get('bit_identical_to_te')]}" for T, f in te8_facts)
                            + ". The FP8 attention that exists in JAX is cuDNN's (cudnn-fp8: e4m3 inputs, per-tensor amax scaling).")
    else:
        s.paragraphs.append("'te-fp8' runs TransformerEngine's DotProductAttention under te.autocast and records whether FP8 "
                            "engaged (fp8_in_program) and whether its output equals plain 'te' bit for bit; cudnn-fp8 is "
                            "cuDNN's FP8 attention through JAX.")
    _fp8_recipes(records, p, s)
    if not (te_why and all(r[2].startswith("skipped: ") for r in fp8_rows)):
        s.paragraphs.append(cells_note("te_fp8", c))
    if te_why and all(r[2].startswith("skipped: ") for r in fp8_rows):
        s.status, s.reason = "skipped", (f"TransformerEngine: {te_why}; FP8: "
                                         + "; ".join(f"{r[0]}: {r[2].removeprefix('skipped: ')}" for r in fp8_rows))
    return s


def render_next(records, cfg: LabConfig, plots_dir=None) -> Section:
    c = cfg
    dt = c.perf_dtype
    s = Section("next", TITLES["next"])
    p = probe(records, "next")
    if p is None:
        return _missing("next", s.title)
    T = c.long_len
    cudnn_why = p["cudnn_why"]
    hd = cells(records, "head_dim")
    rows = []
    for H, verdict in p["verdicts"]:
        rec = next((r for r in hd if r["backend"] == "xla" and r["head_dim"] == H), None) if H in c.timed_head_dims else None
        cud = next((r for r in hd if r["backend"] == "cudnn" and r["head_dim"] == H), None) if verdict == "accepts" else None
        rows.append([H, verdict, "not timed" if rec is None else time_text(rec),
                     "" if cud is None else time_text(cud)])
    s.tables.append(Table(f"Head-dim sweep (B={c.batch}, T=S={T}, N={c.heads})",
                          ["H", "cuDNN (bf16)" if not cudnn_why else "cuDNN's shape rule (bf16)", f"XLA {dt}", "cuDNN bf16"], rows,
                          empty_why={"cuDNN bf16": f"cuDNN: {cudnn_why}" if cudnn_why else "cuDNN refused every head dim"}))
    if cudnn_why:
        s.paragraphs.append(f"cuDNN cannot run here ({cudnn_why}): the head-dim table gives its shape rule only; "
                            "nothing ran on cuDNN.")
    s.paragraphs.append(cells_note("next", c))
    _memory(records, c, s, plots_dir)
    bes = perf_backends(c)
    seq = cells(records, "seq_sweep")
    ratios = []
    for T_ in sorted({r["q_len"] for r in seq}):
        by = {r["backend"]: r for r in seq if r["q_len"] == T_ and r["status"] == "ok"}
        if "xla" in by:
            ratios.append([T_] + [fmt(time_ms(by["xla"]) / time_ms(by[b]), ".2f") if b in by else "–" for b in bes if b != "xla"])
    if ratios:
        s.tables.append(Table("Speed-up over XLA from the sequence sweep (XLA time / path time)", ["T = S"] + [b for b in bes if b != "xla"], ratios))
    return s


def _memory(records, c: LabConfig, s: Section, plots_dir) -> None:
    """Step 11's compiled-memory table and plot; the plot's title claims only what the records show."""
    seqs, bes = memory_seqs(c), memory_backends(c)
    mem = [r for r in records if r.get("kind") == "memory" and r.get("step") == "next"]

    def mem_cell(T_, b):
        m = next((m for m in mem if m["q_len"] == T_ and m["backend"] == b), None)
        if m is None:
            return "–"
        if m["status"] == "oom":
            return f"oom ({(m.get('reason') or '').split(':')[0]})"
        return fmt(m["temp_bytes"] / 2**20, ".4g") if m["temp_bytes"] is not None else m["status"]

    s.tables.append(Table(f"Compiled temp memory (MiB; XLA memory_analysis), B={c.batch}, N={c.heads}, H={c.head_dim}",
                          ["T = S"] + bes, [[T_] + [mem_cell(T_, b) for b in bes] for T_ in seqs]))
    oom = [m for m in mem if m["status"] == "oom"]
    if oom:
        s.paragraphs.append("oom: " + "; ".join(f"{m['backend']} at T={m['q_len']}: {m['reason']}" for m in oom) + ".")
    ok = [m for m in mem if m["status"] == "ok"]
    fused = sorted({m["backend"] for m in ok} - {"naive", "xla"})
    claim = (f"quadratic in T for naive/XLA, flat for {', '.join(fused)}" if fused
             else "quadratic in T for naive and XLA (no fused kernel runs here)")
    made = plots_dir and plots.memory_plot(ok, plots.path_in(plots_dir, "memory_vs_seq.png"),
                                           title=f"compiled temp memory, B={c.batch} N={c.heads} H={c.head_dim}: {claim}")
    if made:
        s.plots.append(made)


def render_decode_step(records, cfg: LabConfig, plots_dir=None) -> Section:
    return render_decode(cells(records, "decode"), cfg, plots_dir)


RENDERERS = {
    "environment": render_environment,
    "qkv": render_qkv,
    "naive": render_naive,
    "jax_nn": render_jax_nn,
    "cudnn": render_cudnn,
    "causal": render_causal,
    "timing": render_timing,
    "sweeps": render_sweeps,
    "gqa": render_gqa,
    "te_fp8": render_te_fp8,
    "next": render_next,
    "decode": render_decode_step,
}


def render_all(records: list[dict], cfg: LabConfig, plots_dir: str | None = None,
               steps: list[str] | None = None) -> list[Section]:
    """Every step's section (or those of ``steps``) from a run's records; a stored step's status
    "failed" (its probe raised) is kept as it was recorded."""
    if plots_dir:
        os.makedirs(plots_dir, exist_ok=True)
    out = []
    for sid in steps or [s for s in RENDERERS if any(r.get("kind") == "lab_step" and r.get("step") == s for r in records)]:
        stored = next((r for r in reversed(records) if r.get("kind") == "lab_step" and r.get("step") == sid), None)
        if stored is not None and stored.get("status") == "failed" and "probe" not in stored:
            out.append(Section(sid, stored.get("title", sid), status="failed", reason=stored.get("reason")))
            continue
        out.append(RENDERERS[sid](records, cfg, plots_dir))
    return out
