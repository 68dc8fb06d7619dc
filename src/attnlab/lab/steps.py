"""The codelab's probing steps (1-6): each a probe ``(ctx) -> facts`` that runs JAX, rendered by
``attnlab.lab.render`` from the stored facts. Registered in ``BASICS`` in order."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..api import dot_product as api
from .. import backends
from ..backends.cudnn import hlo_uses_cudnn
from ..reference.inputs import random_qkv
from ..reference.float64 import check_close, reference_attention
from ..core.spec import prepare
from . import render
from .core import LabConfig, LabContext, Step


def _qkv(cfg: LabConfig, dtype="float32", seed=0):
    return random_qkv(cfg.batch, cfg.q_len, cfg.q_len, cfg.heads, cfg.heads, cfg.head_dim, dtype, seed)


def probe_environment(ctx: LabContext) -> dict:
    cfg = ctx.cfg
    e = ctx.env_full
    spec = prepare(*_qkv(cfg, "bfloat16")).spec
    rows = []
    for b in backends.all_backends():
        avail = b.available()
        sup = None if avail else b.supports(spec)   # an unavailable backend's reason is said once, in its own column
        runs = "yes" if avail is None and sup is None else "no"
        rows.append([b.name, "yes" if avail is None else "no", avail or "", runs,
                     "(not available)" if avail else (sup or ""), b.description])
    keep = ("jax", "jaxlib", "device_count", "device_kind", "platform", "cudnn", "gpu_note", "optional")
    return {"env": {k: e.get(k) for k in keep}, "backends": rows}


def probe_qkv(ctx: LabContext) -> dict:
    q, k, v = _qkv(ctx.cfg)
    return {"tensors": [{"name": n, "shape": list(x.shape), "dtype": str(x.dtype), "layout": lay,
                         "mean": float(jnp.mean(x)), "std": float(jnp.std(x))}
                        for n, x, lay in (("query", q, "BTNH"), ("key", k, "BSKH"), ("value", v, "BSKH"))]}


def probe_naive(ctx: LabContext) -> dict:
    q, k, v = _qkv(ctx.cfg)
    out = jax.jit(lambda q, k, v: api.attention(q, k, v, implementation="naive"))(q, k, v)
    verdict = check_close(out, q, k, v)
    return {"shape": list(out.shape), "dtype": str(out.dtype), "rel_err": verdict.rel_err, "limit": verdict.limit,
            "ok": bool(verdict.ok), "rule": verdict.rule}


def probe_jax_nn(ctx: LabContext) -> dict:
    q, k, v = _qkv(ctx.cfg)
    naive = jax.jit(lambda q, k, v: api.attention(q, k, v, implementation="naive"))(q, k, v)
    fn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v)  # noqa: E731 - the codelab's call
    out = jax.jit(fn)(q, k, v)
    diff = float(jnp.max(jnp.abs(out.astype(jnp.float32) - naive.astype(jnp.float32))))
    close = bool(np.allclose(np.asarray(out), np.asarray(naive), atol=1e-5, rtol=1e-5))
    return {"max_abs_diff": diff, "allclose": close, "cudnn_in_hlo": bool(hlo_uses_cudnn(fn, q, k, v))}


def probe_cudnn(ctx: LabContext) -> dict:
    q, k, v = _qkv(ctx.cfg, "bfloat16")
    why = backends.get("cudnn").why_not(prepare(q, k, v).spec)
    if why:
        return {"why": why}
    fn = lambda q, k, v: api.attention(q, k, v, implementation="cudnn")  # noqa: E731
    out = jax.jit(fn)(q, k, v)
    xla = jax.jit(lambda q, k, v: api.attention(q, k, v, implementation="xla"))(q, k, v)
    ran = hlo_uses_cudnn(fn, q, k, v)
    ref = reference_attention(q, k, v)
    v_cudnn = check_close(out, q, k, v, ref=ref)
    v_xla = check_close(xla, q, k, v, ref=ref)
    diff = float(jnp.max(jnp.abs(out.astype(jnp.float32) - xla.astype(jnp.float32))))
    verdict = lambda x: {"rel_err": x.rel_err, "limit": x.limit, "ok": bool(x.ok)}  # noqa: E731
    return {"why": None, "cudnn_in_hlo": bool(ran), "cudnn": verdict(v_cudnn), "xla": verdict(v_xla), "max_abs_diff": diff}


def probe_causal(ctx: LabContext) -> dict:
    q, k, v = _qkv(ctx.cfg)

    @jax.jit
    def both(q, k, v):   # one compiled program, not a dispatch of each op
        full, causal = api.attention(q, k, v), api.attention(q, k, v, is_causal=True)
        d = jnp.abs(full.astype(jnp.float32) - causal.astype(jnp.float32))
        return causal, jnp.max(d[:, 0]), jnp.max(d[:, -1])

    causal, d0, dl = both(q, k, v)
    v_c = check_close(causal, q, k, v, is_causal=True)
    return {"diff_pos0": float(d0), "diff_last": float(dl), "rel_err": v_c.rel_err, "limit": v_c.limit,
            "correct": bool(v_c.ok)}


BASICS = {sid: Step(sid, render.RENDERERS[sid], probe=fn) for sid, fn in (
    ("environment", probe_environment),
    ("qkv", probe_qkv),
    ("naive", probe_naive),
    ("jax_nn", probe_jax_nn),
    ("cudnn", probe_cudnn),
    ("causal", probe_causal),
)}
