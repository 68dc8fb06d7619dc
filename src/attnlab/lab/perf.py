"""The codelab's measuring steps (7-11): timing, sweeps, MHA/GQA/MQA, TransformerEngine + FP8, next steps.

Each declares the cells it times as ``Sweep``s (``sweeps_<step>(cfg)``, data: the sweep engine runs
them and resumes them), probes what is not a timed cell (``probe_<step>(ctx)``), and is rendered by
``attnlab.lab.render`` from the records alone.
"""
from __future__ import annotations

from .. import backends
from ..sweep.spec import Sweep
from . import render
from ..report import tables
from .core import LabConfig, LabContext, Step
from .gqa_probe import probe_gqa
from .memory_probe import compiled_temp
from .plan import LAB_FP8_RECIPES, fp8_seqs, gqa_cells, gqa_shape, memory_backends, memory_seqs, perf_backends, te_seqs
from .render import fp8_recipe_names


def sweeps_timing(cfg: LabConfig) -> list[Sweep]:
    """The performance paths (``plan.perf_backends``) at the default shape, in the performance dtype."""
    c = cfg
    return [Sweep(perf_backends(c), dtype=[c.perf_dtype], batch=[c.batch], q_len=[c.q_len], heads=[c.heads],
                  head_dim=[c.head_dim], name="timing")]


def sweeps_sweeps(cfg: LabConfig) -> list[Sweep]:
    c = cfg
    common = dict(heads=[c.heads], head_dim=[c.head_dim], dtype=[c.perf_dtype])
    return [Sweep(perf_backends(c), batch=[c.batch], q_len=c.seq_lens, name="seq_sweep", **common),
            Sweep(perf_backends(c), batch=c.batches, q_len=[c.batch_sweep_len], name="batch_sweep", **common)]


def probe_sweeps(ctx: LabContext) -> dict:
    """The device's peak and roofs (the roofline plot's lines)."""
    from ..core import device
    from ..measure.peaks import peak_tflops, roofs
    from ..reference.float64 import default_matmul_is_tf32

    kind, dt, tf32 = device.current().kind, ctx.cfg.perf_dtype, default_matmul_is_tf32()
    return {"device_kind": kind, "tf32": tf32, "peak_tflops": peak_tflops(kind, dt, tf32=tf32), "roofs": roofs(kind, dt, tf32)}


def sweeps_gqa(cfg: LabConfig) -> list[Sweep]:
    c, g = cfg, gqa_shape(cfg)
    return [Sweep([b], batch=[c.batch], q_len=[g["T"]], heads=[g["N"]], kv_heads=ks, head_dim=[c.head_dim],
                  dtype=[c.perf_dtype], causal=[g["causal"]], name="gqa") for b, ks in gqa_cells(c)]


def _te_fp8_why() -> tuple[str | None, dict[str, str | None]]:
    """(why TransformerEngine cannot run, {FP8 path: why it cannot run}), None where it can."""
    known = backends.names()
    te = backends.get("te") if "te" in known else None
    te_why = "the 'te' backend is not registered" if te is None else te.available()
    fp8 = {}
    for name in ("te-fp8", "cudnn-fp8"):
        b = backends.get(name) if name in known else None
        fp8[name] = "not registered" if b is None else b.available()
    return te_why, fp8


def _recipes_why() -> dict[str, str | None]:
    """{FP8 recipe backend (cudnn-fp8*): why it cannot run here, None where it can}."""
    return {n: backends.get(n).available() for n in fp8_recipe_names(backends.variant_names())}


def sweeps_te_fp8(cfg: LabConfig) -> list[Sweep]:
    c = cfg
    te_why, fp8 = _te_fp8_why()
    out = []
    if not te_why:   # at the sequence sweep's shape: XLA's and cuDNN's cells are the sweep's
        out.append(Sweep(["te"] + perf_backends(c), batch=[c.batch], q_len=te_seqs(c), heads=[c.heads],
                         head_dim=[c.head_dim], dtype=["bfloat16"], name="te"))
    common = dict(batch=[c.batch], heads=[c.heads], dtype=["bfloat16"], causal=[True], head_dim=[128])
    for name, why in fp8.items():
        if not why:
            out.append(Sweep([name, "cudnn"], q_len=fp8_seqs(c), name="fp8", **common))
    recipes = [n for n, why in _recipes_why().items() if not why and n in LAB_FP8_RECIPES]
    if recipes and not c.quick:   # the recipes differ on outlier channels; on gaussian inputs amax is the fp8 sweep's
        T = [max(fp8_seqs(c))]
        out.append(Sweep(["cudnn-fp8", "cudnn"], q_len=T, inputs=["gaussian"], name="fp8-recipes", **common))
        out.append(Sweep(recipes + ["cudnn"], q_len=T, inputs=["channel-outliers"], name="fp8-recipes", **common))
    return out


def probe_te_fp8(ctx: LabContext) -> dict:
    te_why, fp8 = _te_fp8_why()
    return {"te_why": te_why, "fp8_why": fp8, "recipes_why": _recipes_why()}


def _cudnn_verdicts(cfg: LabConfig):
    return tables.cudnn_head_dims(cfg.head_dims, batch=cfg.batch, seq=cfg.long_len, heads=cfg.heads)


def sweeps_next(cfg: LabConfig) -> list[Sweep]:
    c = cfg
    common = dict(batch=[c.batch], q_len=[c.long_len], heads=[c.heads], name="head_dim")
    out = [Sweep(["xla"], head_dim=list(c.timed_head_dims), dtype=[c.perf_dtype], **common)]
    verdicts, _ = _cudnn_verdicts(c)
    timed = {c.head_dim} if c.quick else {c.head_dim, 128, 256}   # the default, and the largest cuDNN takes
    accepted = [H for H, v in verdicts if v == "accepts" and H in timed]
    if accepted:
        out.append(Sweep(["cudnn"], head_dim=accepted, dtype=["bfloat16"], **common))
    return out


def probe_next(ctx: LabContext) -> dict:
    """cuDNN's verdict per head dim, and the compiled temp memory per path and T (stored as
    ``memory`` records of step "next")."""
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


PERF = {
    "timing": Step("timing", render.render_timing, sweeps=sweeps_timing),
    "sweeps": Step("sweeps", render.render_sweeps, sweeps=sweeps_sweeps, probe=probe_sweeps),
    "gqa": Step("gqa", render.render_gqa, sweeps=sweeps_gqa, probe=probe_gqa),
    "te_fp8": Step("te_fp8", render.render_te_fp8, sweeps=sweeps_te_fp8, probe=probe_te_fp8),
    "next": Step("next", render.render_next, sweeps=sweeps_next, probe=probe_next),
}
