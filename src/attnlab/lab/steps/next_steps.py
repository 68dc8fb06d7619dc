"""The next-steps step: cuDNN's verdict and XLA's time per head dim, compiled memory against T, speed-ups."""
from __future__ import annotations

from ...report import shared_rows
from .. import plots
from ..plan import perf_backends
from ..render_common import cells, fail_on_failed_cells, fmt, section_renderer, speedup_text, time_text
from ..step_types import LabConfig, LabContext, Section, Step, Table, jax_side

TITLE = "Next steps: head dims, memory, speed-ups"


def memory_seqs(cfg: LabConfig) -> list[int]:
    """T = S of the compiled-memory probe (compiled, never run): wide enough that the unfused paths'
    T² scores outgrow the device (predicted oom) while a fused kernel stays flat."""
    if cfg.gpu:
        return [256, 1024] if cfg.quick else [1024, 4096, 16384, 65536]
    return [32, 64] if cfg.quick else [128, 512, 2048]


def memory_backends(cfg: LabConfig) -> list[str]:
    return perf_backends(cfg)


def _cudnn_verdicts(cfg: LabConfig):
    return shared_rows.cudnn_head_dims(cfg.head_dims, batch=cfg.batch, seq=cfg.long_len, heads=cfg.heads)


def sweeps(cfg: LabConfig) -> list:
    Sweep = jax_side().Sweep
    c = cfg
    common = dict(batch=[c.batch], q_len=[c.long_len], heads=[c.heads], name="head_dim")
    out = [Sweep(["xla"], head_dim=list(c.timed_head_dims), dtype=[c.perf_dtype], **common)]
    verdicts, _ = _cudnn_verdicts(c)
    timed = {c.head_dim} if c.quick else {c.head_dim, 128, 256}   # the default, and the largest cuDNN takes
    accepted = [H for H, v in verdicts if v == "accepts" and H in timed]
    if accepted:
        out.append(Sweep(["cudnn"], head_dim=accepted, dtype=["bfloat16"], **common))
    return out


def probe(ctx: LabContext) -> dict:
    """cuDNN's verdict per head dim, and the compiled temp memory per path and T (stored as
    ``memory`` records of step "next")."""
    compiled_temp = jax_side().compiled_temp
    c = ctx.cfg
    dt = c.perf_dtype
    verdicts, cudnn_why = _cudnn_verdicts(c)
    for T_ in memory_seqs(c):
        for b in memory_backends(c):
            m = compiled_temp(b, c.batch, T_, c.heads, c.head_dim, "bfloat16" if b == "cudnn" else dt)
            ctx.append({"kind": "memory", "step": "next", "backend": b, "q_len": T_, "batch": c.batch,
                        "heads": c.heads, "head_dim": c.head_dim, "env": ctx.env,
                        **{k: m.get(k) for k in ("status", "reason", "temp_bytes", "peak_bytes", "estimate_bytes")}})
    return {"verdicts": verdicts, "cudnn_why": cudnn_why}


def cells_note(cfg: LabConfig) -> str:
    c = cfg
    dims = c.timed_head_dims
    return (f"Cells: XLA at H = {', '.join(map(str, dims))} (the default" + (
        f" and {dims[-1]}, which cuDNN refuses)" if len(dims) > 1 else ")") + (f", cuDNN at H = {c.head_dim}, 128 and 256 where it accepts them (256 is its largest)"
                                if c.gpu and not c.quick else "")
            + f"; the memory table is compiled, never run, at T = {', '.join(map(str, memory_seqs(c)))}.")


@section_renderer("next", TITLE)
def render(s, p, records, cfg: LabConfig, plots_dir=None) -> None:
    c = cfg
    dt = c.perf_dtype
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
    s.paragraphs.append(cells_note(c))
    fail_on_failed_cells(s, hd)
    _memory(records, c, s, plots_dir)
    bes = perf_backends(c)
    seq = cells(records, "seq_sweep")
    ratios = []
    others = [b for b in bes if b != "xla"]
    for T_ in sorted({r["q_len"] for r in seq}):
        by = {r["backend"]: r for r in seq if r["q_len"] == T_}
        if by.get("xla", {}).get("status") == "ok":
            ratios.append([T_, time_text(by["xla"])] + [x for b in others for x in
                                                         (time_text(by[b]) if b in by else "–", speedup_text(by.get(b), by["xla"]))])
    if ratios and others:
        s.tables.append(Table("Speed-up over XLA from the sequence sweep (XLA time / path time; faster or slower only "
                              "where the 25th–75th percentiles of the repeats do not overlap)",
                              ["T = S", "xla"] + [x for b in others for x in (b, f"{b} vs xla")], ratios))

def _memory(records, c: LabConfig, s: Section, plots_dir) -> None:
    """The compiled-memory table and plot; the plot's title claims only what the records show."""
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


STEP = Step("next", TITLE, render, sweeps=sweeps, probe=probe, cells_note=cells_note)
