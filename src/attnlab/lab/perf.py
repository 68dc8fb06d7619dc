"""The codelab's measuring steps (7-11): timing, sweeps, MHA/GQA/MQA, TransformerEngine + FP8, next steps.

Each declares the cells it times as ``Sweep``s (``sweeps_<step>(cfg)``, data: the sweep engine runs
them and resumes them), probes what is not a timed cell (``probe_<step>(ctx)``), and is rendered by
``attnlab.lab.render`` from the records alone.
"""
from __future__ import annotations

from .. import backends
from ..sweep.spec import Sweep
from . import render, tables
from .core import LabConfig, LabContext, Step
from .memory_probe import compiled_temp
from .render import FP8_RECIPE_INPUTS, fp8_recipe_names, fp8_seqs, gqa_shape, memory_seqs, perf_backends


def sweeps_timing(cfg: LabConfig) -> list[Sweep]:
    """naive and XLA in float32, XLA and cuDNN in bfloat16, at the default shape."""
    c = cfg
    shape = dict(batch=[c.batch], q_len=[c.q_len], heads=[c.heads], head_dim=[c.head_dim], name="timing")
    return [Sweep(["naive", "xla"], dtype=["float32"], **shape), Sweep(["xla", "cudnn"], dtype=["bfloat16"], **shape)]


def sweeps_sweeps(cfg: LabConfig) -> list[Sweep]:
    c = cfg
    common = dict(heads=[c.heads], head_dim=[c.head_dim], dtype=[c.perf_dtype])
    return [Sweep(perf_backends(c), batch=[c.batch], q_len=c.seq_lens, name="seq_sweep", **common),
            Sweep(perf_backends(c), batch=c.batches, q_len=[c.batch_sweep_len], name="batch_sweep", **common)]


def probe_sweeps(ctx: LabContext) -> dict:
    """The device's peak and roofs (the roofline plot's lines)."""
    from .. import device
    from ..measure.peaks import peak_tflops, roofs
    from ..reference import default_matmul_is_tf32

    kind, dt, tf32 = device.current().kind, ctx.cfg.perf_dtype, default_matmul_is_tf32()
    return {"device_kind": kind, "tf32": tf32, "peak_tflops": peak_tflops(kind, dt, tf32=tf32), "roofs": roofs(kind, dt, tf32)}


def sweeps_gqa(cfg: LabConfig) -> list[Sweep]:
    c, g = cfg, gqa_shape(cfg)
    kv = list(dict.fromkeys(K for _, K in g["variants"]))
    return [Sweep(perf_backends(c)[1:], batch=[c.batch], q_len=[g["T"]], heads=[g["N"]], kv_heads=kv,
                  head_dim=[c.head_dim], dtype=[c.perf_dtype], causal=[g["causal"]], name="gqa")]


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
    return {n: backends.get(n).available() for n in fp8_recipe_names(backends.names())}


def sweeps_te_fp8(cfg: LabConfig) -> list[Sweep]:
    c = cfg
    te_why, fp8 = _te_fp8_why()
    out = []
    common = dict(batch=[c.batch], heads=[c.heads], dtype=["bfloat16"], causal=[True])
    if not te_why:
        seqs = [128, 256, 512, 1024, 2048] + ([4096, 8192, 16384] if c.gpu and not c.quick else [])
        out.append(Sweep(["te", "xla", "cudnn"], q_len=seqs, head_dim=[c.head_dim], name="te", **common))
    for name, why in fp8.items():
        if not why:
            out.append(Sweep([name, "cudnn"], q_len=fp8_seqs(c), head_dim=[128], name="fp8", **common))
    recipes = [n for n, why in _recipes_why().items() if not why]
    if recipes:   # every recipe on gaussian and outlier-channel inputs at the largest FP8 length
        out.append(Sweep(recipes + ["cudnn"], q_len=[max(fp8_seqs(c))], head_dim=[128], inputs=list(FP8_RECIPE_INPUTS),
                         name="fp8-recipes", **common))
    return out


def probe_te_fp8(ctx: LabContext) -> dict:
    te_why, fp8 = _te_fp8_why()
    return {"te_why": te_why, "fp8_why": fp8, "recipes_why": _recipes_why()}


def _cudnn_verdicts(cfg: LabConfig):
    return tables.cudnn_head_dims(cfg.head_dims, batch=cfg.batch, seq=cfg.long_len, heads=cfg.heads)


def sweeps_next(cfg: LabConfig) -> list[Sweep]:
    c = cfg
    common = dict(batch=[c.batch], q_len=[c.long_len], heads=[c.heads], name="head_dim")
    timed = [H for H in c.head_dims if H in c.timed_head_dims]
    out = [Sweep(["xla"], head_dim=timed, dtype=[c.perf_dtype], **common)] if timed else []
    verdicts, _ = _cudnn_verdicts(c)
    accepted = [H for H, v in verdicts if v == "accepts"]
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
        for b in perf_backends(c):
            m = compiled_temp(b, c.batch, T_, c.heads, c.head_dim, "bfloat16" if b == "cudnn" else dt)
            ctx.append({"kind": "memory", "step": "next", "backend": b, "q_len": T_, "batch": c.batch,
                        "heads": c.heads, "head_dim": c.head_dim, "env": ctx.env,
                        **{k: m.get(k) for k in ("status", "reason", "temp_bytes", "peak_bytes", "estimate_bytes")}})
    return {"verdicts": verdicts, "cudnn_why": cudnn_why}


PERF = {
    "timing": Step("timing", render.render_timing, sweeps=sweeps_timing),
    "sweeps": Step("sweeps", render.render_sweeps, sweeps=sweeps_sweeps, probe=probe_sweeps),
    "gqa": Step("gqa", render.render_gqa, sweeps=sweeps_gqa),
    "te_fp8": Step("te_fp8", render.render_te_fp8, sweeps=sweeps_te_fp8, probe=probe_te_fp8),
    "next": Step("next", render.render_next, sweeps=sweeps_next, probe=probe_next),
}
