"""The codelab's measuring steps (7-11): timing, sweeps, MHA/GQA/MQA, TransformerEngine + FP8, next steps."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import api, backends, device
from ..measure import Cell
from ..measure.cell import classify
from ..measure.memory import compiled_memory
from ..measure.peaks import format_flops, peak_tflops, roofs
from ..records import time_ms, timing
from ..reference import default_matmul_is_tf32
from ..spec import prepare
from . import plots, tables
from .core import LabContext, Section, Table


def _fmt(x, spec=".4g"):
    return "–" if x is None else format(x, spec)


def _status_or(rec, text):
    return text if rec["status"] == "ok" else f"{rec['status']}: {(rec['reason'] or '')[:80]}"


def _spread(rec, prefix: str | None = None) -> str:
    """A timed record's spread over its repeats: "p25–p75" (ms), or "" when not timed."""
    if prefix is None:
        t = timing(rec) if rec.get("status") == "ok" else None
        return "" if t is None else f"{t['p25']:.3g}–{t['p75']:.3g}"
    lo, hi = rec.get(f"{prefix}_p25_ms"), rec.get(f"{prefix}_p75_ms")
    return "" if lo is None or hi is None else f"{lo:.3g}–{hi:.3g}"


def _time_text(rec) -> str:
    """"0.354 ms [0.33–0.36]": the median and, in brackets, the 25th–75th percentile of the repeats."""
    return _status_or(rec, f"{time_ms(rec):.4g} ms [{_spread(rec)}]" if rec["status"] == "ok" else "")


NO_CUPTI = "kernel time needs a GPU (CUPTI); wall clock shown"
SPREAD_NOTE = "Times are the median of the repeats, with the 25th–75th percentile in brackets (the spread)."


def _perf_backends(ctx: LabContext) -> list[str]:
    return ["naive", "xla", "cudnn"] if ctx.cfg.gpu else ["naive", "xla"]


def _timer_note(recs) -> str:
    if any(r.get("timer") == "cupti" for r in recs):
        return "Times are GPU kernel time measured with CUPTI, compile time apart. " + SPREAD_NOTE
    return "No GPU here: times are host wall clock around each blocked call (no CUPTI), compile time apart. " + SPREAD_NOTE


def step_timing(ctx: LabContext) -> Section:
    c = ctx.cfg
    paths = [("naive", "float32"), ("xla", "float32"), ("xla", "bfloat16"), ("cudnn", "bfloat16")]
    recs = [ctx.measure(Cell(b, c.batch, c.q_len, c.q_len, c.heads, c.heads, c.head_dim, dt), "timing") for b, dt in paths]
    s = Section("timing", f"7. Timing at the default shape (B={c.batch}, T={c.q_len}, N={c.heads}, H={c.head_dim})")
    s.tables.append(Table("Kernel time and wall time side by side (ms; median, and the 25th–75th percentile of the repeats)",
                          ["path", "dtype", "kernel (CUPTI)", "kernel p25–p75", "wall per blocked call", "wall p25–p75",
                           "pipelined wall", "dispatch = wall − kernel", "compile s", "status"],
                          [[r["backend"], r["dtype"], _fmt(r["kernel_ms"]), _spread(r, "kernel"), _fmt(r["wall_ms"]),
                            _spread(r, "wall"), _fmt(r["pipelined_ms"]), _fmt(r["dispatch_ms"]), _fmt(r["compile_s"], ".3g"),
                            _status_or(r, "ok")] for r in recs],
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
    s.paragraphs.append(_timer_note(recs))
    if ok:
        labels = [f"{r['backend']} {r['dtype']}" for r in ok]
        s.plots.append(plots.bars(labels, [r["wall_ms"] for r in ok], plots.path_in(ctx.plots_dir, "timing_wall.png"),
                                  title="wall ms per blocked call (median; whiskers: 25th–75th percentile)", ylabel="ms",
                                  spread=[(r.get("wall_p25_ms"), r.get("wall_p75_ms")) for r in ok]))
        if any(r["kernel_ms"] for r in ok):
            s.plots.append(plots.bars(labels, [r["kernel_ms"] or 0 for r in ok], plots.path_in(ctx.plots_dir, "timing_kernel.png"),
                                      title="CUPTI kernel ms per call (median; whiskers: 25th–75th percentile)", ylabel="ms",
                                      spread=[(r.get("kernel_p25_ms"), r.get("kernel_p75_ms")) for r in ok]))
    s.facts = {f"{r['backend']}_{r['dtype']}": {"kernel_ms": r["kernel_ms"], "wall_ms": r["wall_ms"], "status": r["status"]} for r in recs}
    return s


def _sweep_table(recs, x: str, title: str):
    bes = list(dict.fromkeys(r["backend"] for r in recs))
    xs = sorted({r[x] for r in recs})
    rows = []
    for xv in xs:
        row = [xv]
        for b in bes:
            r = next((r for r in recs if r[x] == xv and r["backend"] == b), None)
            row.append("" if r is None else _status_or(r, f"{_time_text(r)} · {format_flops(r['tflops'] * 1e12)}"
                                                           if r["status"] == "ok" else ""))
        rows.append(row)
    return Table(title, [x] + bes, rows)


def step_sweeps(ctx: LabContext) -> Section:
    c = ctx.cfg
    dt = c.perf_dtype
    s = Section("sweeps", "8. Sequence-length and batch sweeps")
    seq = [ctx.measure(Cell(b, c.batch, T, T, c.heads, c.heads, c.head_dim, dt), "seq_sweep")
           for T in c.seq_lens for b in _perf_backends(ctx)]
    TB = c.batch_sweep_len
    bat = [ctx.measure(Cell(b, B, TB, TB, c.heads, c.heads, c.head_dim, dt), "batch_sweep")
           for B in c.batches for b in _perf_backends(ctx)]
    ctx.shared["seq_sweep"] = seq
    s.tables.append(_sweep_table(seq, "q_len", f"Sequence sweep (B={c.batch}, N={c.heads}, H={c.head_dim}, {dt})"))
    s.tables.append(_sweep_table(bat, "batch", f"Batch sweep (T=S={TB}, N={c.heads}, H={c.head_dim}, {dt})"))
    info = device.current()
    tf32 = default_matmul_is_tf32()
    pk = peak_tflops(info.kind, dt, tf32=tf32)
    roof = roofs(info.kind, dt, tf32)
    d = ctx.plots_dir
    for made in (
        plots.line_plot(seq, "q_len", "time", plots.path_in(d, "latency_vs_seq.png"), title="latency vs sequence length",
                        xlabel="T = S", ylabel="ms"),
        plots.line_plot(seq, "q_len", "tflops", plots.path_in(d, "tflops_vs_seq.png"), title="FLOP/s vs sequence length",
                        xlabel="T = S", ylabel="TFLOP/s", logy=False, hline=pk, hline_label=f"{info.kind} peak {pk} TFLOP/s" if pk else None),
        plots.line_plot(bat, "batch", "time", plots.path_in(d, "batch_sweep.png"), title=f"batch sweep at T = {TB}",
                        xlabel="batch", ylabel="ms"),
        plots.roofline(seq + bat, plots.path_in(d, "roofline.png"), datasheet=roof["datasheet"], measured=roof["measured"],
                       title=f"roofline ({info.kind})", group=lambda r: {"seq_sweep": "sequence sweep",
                                                                          "batch_sweep": "batch sweep"}.get(r.get("step"), "")),
    ):
        if made:
            s.plots.append(made)
    s.paragraphs.append(_timer_note(seq))
    if not roof["datasheet"]:
        s.paragraphs.append(f"No datasheet peak is known for {info.kind}: the roofline draws "
                            + ("the measured ceilings of `attnlab ceilings` only." if roof["measured"] else
                               "no roof (run `attnlab ceilings` to measure this device's and draw them)."))
    elif not roof["measured"]:
        s.paragraphs.append("The roofline's measured roof is missing: run `attnlab ceilings` to draw it beside the datasheet's.")
    best = {}
    for r in seq:
        if r["status"] == "ok":
            best[r["backend"]] = max(best.get(r["backend"], 0), r["tflops"])
    s.facts = {"best_tflops": best, "cells": len(seq) + len(bat),
               "failed_cells": sum(r["status"] != "ok" for r in seq + bat)}
    return s


def step_gqa(ctx: LabContext) -> Section:
    c = ctx.cfg
    dt = c.perf_dtype
    T = c.long_len
    N = 32 if c.gpu else c.heads
    variants = [("MHA", N), ("GQA", N // 4 if N >= 8 else max(1, N // 2)), ("MQA", 1)]
    causal = not c.cpu_quick   # quick on a CPU: MHA is the default shape, measured already
    s = Section("gqa", "9. MHA, GQA and MQA")
    rows, recs = [], []
    for name, K in variants:
        for b in _perf_backends(ctx)[1:]:  # xla (and cudnn on a GPU)
            r = ctx.measure(Cell(b, c.batch, T, T, N, K, c.head_dim, dt, causal), "gqa")
            recs.append(r)
            rows.append([name, b, f"({c.batch}, {T}, {N}, {c.head_dim})", f"({c.batch}, {T}, {K}, {c.head_dim})",
                         _fmt(r["rel_err"], ".2e"), _time_text(r),
                         f"{2 * K * c.head_dim * jnp.dtype(dt).itemsize} B"])
    s.tables.append(Table(f"Query heads N={N}; key/value heads K ({'causal' if causal else 'no mask'}, T=S={T}, {dt})",
                          ["variant", "backend", "query shape", "key/value shape", "rel L2 vs float64", "time", "KV cache / token / layer"], rows))
    s.tables.append(Table(tables.KV_TITLE, tables.KV_COLUMNS, tables.kv_cache_rows()))
    s.paragraphs.append("GQA lets G = N/K query heads share one key/value head: same FLOPs as MHA, K/N of the "
                        "key/value memory and bandwidth. attnlab broadcasts key/value heads rather than copying them.")
    s.facts = {"cells": [{k: r[k] for k in ("backend", "kv_heads", "status", "rel_err")} for r in recs]}
    if any(r["status"] == "incorrect" for r in recs):
        s.status, s.reason = "failed", "a GQA/MQA path disagreed with the float64 reference"
    return s


def step_te_fp8(ctx: LabContext) -> Section:
    c = ctx.cfg
    s = Section("te_fp8", "10. TransformerEngine and FP8")
    known = backends.names()
    te = backends.get("te") if "te" in known else None
    te_why = "the 'te' backend is not registered" if te is None else te.available()
    seqs = [128, 256, 512, 1024, 2048] + ([4096, 8192, 16384] if c.gpu and not c.quick else [])
    if te_why:
        s.paragraphs.append(f"TransformerEngine: skipped — {te_why}.")
    else:
        recs = [ctx.measure(Cell(b, c.batch, T, T, c.heads, c.heads, c.head_dim, "bfloat16", True), "te")
                for T in seqs for b in ("te", "xla", "cudnn")]
        s.tables.append(_sweep_table(recs, "q_len", "TransformerEngine DotProductAttention vs XLA vs cuDNN (bf16, causal)"))
        made = plots.line_plot(recs, "q_len", "time", plots.path_in(ctx.plots_dir, "te_latency.png"),
                               title="TransformerEngine vs XLA vs cuDNN (bf16 causal)", xlabel="T = S", ylabel="ms")
        if made:
            s.plots.append(made)
    fp8_rows, te8_facts = [], []
    for name in ("te-fp8", "cudnn-fp8"):
        b = backends.get(name) if name in known else None
        why = "not registered" if b is None else b.available()
        if why:
            fp8_rows.append([name, "", f"skipped: {why}", "", "", "", "", ""])
            continue
        for T in ([1024, 4096] if c.gpu else [256]):
            r8 = ctx.measure(Cell(name, c.batch, T, T, c.heads, c.heads, 128, "bfloat16", True), "fp8")
            r16 = ctx.measure(Cell("cudnn", c.batch, T, T, c.heads, c.heads, 128, "bfloat16", True), "fp8")
            sp = time_ms(r16) / time_ms(r8) if r8["status"] == "ok" and r16["status"] == "ok" else None
            facts = r8.get("facts") or {}
            if name == "te-fp8" and "fp8_in_program" in facts:
                te8_facts.append((T, facts))
            engaged = {True: "yes", False: "no"}.get(facts.get("fp8_in_program"), "yes" if name == "cudnn-fp8" else "")
            fp8_rows.append([name, f"T=S={T}", "ok" if r8["status"] == "ok" else _status_or(r8, ""),
                             _time_text(r8) if r8["status"] == "ok" else "", _fmt(r8["rel_err"], ".2e"), engaged,
                             _status_or(r16, f"{time_ms(r16):.4g} ms") + f" (rel L2 {_fmt(r16['rel_err'], '.2e')})", _fmt(sp, ".2f")])
    s.tables.append(Table("FP8 attention (bf16 in and out, causal, H=128)",
                          ["path", "shape", "status", "FP8 time", "FP8 rel L2 vs float64", "FP8 in the program",
                           "cuDNN bf16", "speed-up"], fp8_rows,
                          empty_why={c: "nothing ran: no FP8 path is available here" for c in
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
    if te_why and all(r[2].startswith("skipped: ") for r in fp8_rows):
        s.status, s.reason = "skipped", (f"TransformerEngine: {te_why}; FP8: "
                                         + "; ".join(f"{r[0]}: {r[2].removeprefix('skipped: ')}" for r in fp8_rows))
    return s


def _compiled_temp(backend: str, T: int, c, dt) -> dict:
    shapes = [jax.ShapeDtypeStruct((c.batch, T, c.heads, c.head_dim), dt) for _ in range(3)]
    spec = prepare(*shapes).spec
    why = backends.get(backend).why_not(spec)
    if why:
        return {"status": "unsupported", "reason": f"{backend}: {why}", "temp_bytes": None}
    try:
        comp = jax.jit(lambda q, k, v: api.attention(q, k, v, implementation=backend)).lower(*shapes).compile()
    except Exception as e:  # noqa: BLE001
        status, reason = classify(e, "compile")
        return {"status": status, "reason": reason, "temp_bytes": None}
    return {"status": "ok", "reason": None, **compiled_memory(comp)}


def step_next(ctx: LabContext) -> Section:
    c = ctx.cfg
    dt = c.perf_dtype
    s = Section("next", "11. Next steps: head dims, memory, speed-ups")
    T = c.long_len
    verdicts, cudnn_why = tables.cudnn_head_dims(c.head_dims, batch=c.batch, seq=T, heads=c.heads)
    rows = []
    for H, verdict in verdicts:
        rec = ctx.measure(Cell("xla", c.batch, T, T, c.heads, c.heads, H, dt), "head_dim") if H in c.timed_head_dims else None
        cud = (ctx.measure(Cell("cudnn", c.batch, T, T, c.heads, c.heads, H, "bfloat16"), "head_dim")
               if verdict == "accepts" else None)
        rows.append([H, verdict, "not timed (--quick)" if rec is None else _time_text(rec),
                     "" if cud is None else _time_text(cud)])
    s.tables.append(Table(f"Head-dim sweep (B={c.batch}, T=S={T}, N={c.heads})",
                          ["H", "cuDNN (bf16)" if not cudnn_why else "cuDNN's shape rule (bf16)", f"XLA {dt}", "cuDNN bf16"], rows,
                          empty_why={"cuDNN bf16": f"cuDNN: {cudnn_why}" if cudnn_why else "cuDNN refused every head dim"}))
    if cudnn_why:
        s.paragraphs.append(f"cuDNN cannot run here ({cudnn_why}): the head-dim table gives its shape rule only; "
                            "nothing ran on cuDNN.")
    seqs = c.seq_lens + ([32768] if c.gpu and not c.quick else [])
    mem = []
    for T_ in seqs:
        for b in _perf_backends(ctx):
            m = _compiled_temp(b, T_, c, "bfloat16" if b == "cudnn" else dt)
            m.update(backend=b, q_len=T_)
            mem.append(m)
            ctx.store.append({"kind": "memory", "step": "next", "backend": b, "q_len": T_, "batch": c.batch,
                              "heads": c.heads, "head_dim": c.head_dim, **{k: m.get(k) for k in ("status", "reason", "temp_bytes", "peak_bytes")}, "env": ctx.env})
    bes = _perf_backends(ctx)
    s.tables.append(Table(f"Compiled temp memory (MiB; XLA memory_analysis().temp_size_in_bytes), B={c.batch}, N={c.heads}, H={c.head_dim}", ["T = S"] + bes,
                          [[T_] + [next((_fmt(m["temp_bytes"] / 2**20, ".4g") if m["temp_bytes"] is not None else m["status"])
                                        for m in mem if m["q_len"] == T_ and m["backend"] == b) for b in bes] for T_ in seqs]))
    made = plots.memory_plot([m for m in mem if m["status"] == "ok"], plots.path_in(ctx.plots_dir, "memory_vs_seq.png"),
                             title=f"compiled temp bytes (XLA memory_analysis), B={c.batch} N={c.heads} H={c.head_dim}\n"
                                   "quadratic in T for naive/XLA, flat for fused kernels")
    if made:
        s.plots.append(made)
    seq = ctx.shared.get("seq_sweep", [])
    ratios = []
    for T_ in sorted({r["q_len"] for r in seq}):
        by = {r["backend"]: r for r in seq if r["q_len"] == T_ and r["status"] == "ok"}
        if "xla" in by:
            row = [T_] + [_fmt(time_ms(by["xla"]) / time_ms(by[b]), ".2f") if b in by else "–" for b in bes if b != "xla"]
            ratios.append(row)
    if ratios:
        s.tables.append(Table("Speed-up over XLA from the sequence sweep (XLA time / path time)", ["T = S"] + [b for b in bes if b != "xla"], ratios))
    return s


PERF = {
    "timing": step_timing,
    "sweeps": step_sweeps,
    "gqa": step_gqa,
    "te_fp8": step_te_fp8,
    "next": step_next,
}
