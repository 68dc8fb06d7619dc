"""The codelab's steps, each a function (config) -> Section. Registered in ``STEPS`` in order."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import api, backends
from ..backends.cudnn import hlo_uses_cudnn
from ..inputs import random_qkv
from ..reference import check_close, reference_attention
from ..spec import prepare
from .core import LabConfig, LabContext, Section, Table


def _qkv(cfg: LabConfig, dtype="float32", seed=0):
    return random_qkv(cfg.batch, cfg.q_len, cfg.q_len, cfg.heads, cfg.heads, cfg.head_dim, dtype, seed)


def step_environment(ctx: LabContext) -> Section:
    cfg = ctx.cfg
    e = ctx.env_full
    s = Section("environment", "1. Environment and GPU check")
    s.paragraphs.append(f"JAX {e['jax']} (jaxlib {e['jaxlib']}) on {e['device_count']} × {e['device_kind']} "
                        f"({e['platform']}); cuDNN {e['cudnn'] or 'not loaded'}.")
    if e.get("gpu_note"):
        s.paragraphs.append(e["gpu_note"] + ".")
    spec = prepare(*_qkv(cfg, "bfloat16")).spec
    rows = []
    for b in backends.all_backends():
        avail = b.available()
        sup = None if avail else b.supports(spec)   # an unavailable backend's reason is said once, in its own column
        runs = "yes" if avail is None and sup is None else "no"
        rows.append([b.name, "yes" if avail is None else "no", avail or "", runs,
                     "(not available)" if avail else (sup or ""), b.description])
    s.tables.append(Table(f"Backends on this machine (input: {cfg.batch}×{cfg.q_len}×{cfg.heads}×{cfg.head_dim} bf16)",
                          ["backend", "available", "why not available", "runs this input", "why not this input", "what"], rows))
    s.tables.append(Table("Optional libraries", ["library", "version"],
                          [[k, v or "not installed"] for k, v in e["optional"].items()]))
    s.facts = {"platform": e["platform"], "device_kind": e["device_kind"], "cudnn": e["cudnn"],
               "backends_available": [r[0] for r in rows if r[1] == "yes"]}
    return s


def step_qkv(ctx: LabContext) -> Section:
    cfg = ctx.cfg
    q, k, v = _qkv(cfg)
    s = Section("qkv", "2. Queries, keys and values")
    s.paragraphs.append("Layout BTNH for the query and BSKH for key and value: batch, sequence, heads, head dim. "
                        "Inputs are drawn from a standard normal distribution (never zeros, which hide bugs).")
    s.tables.append(Table("Inputs", ["tensor", "shape", "dtype", "layout", "mean", "std"],
                          [[n, str(tuple(x.shape)), str(x.dtype), lay, f"{float(jnp.mean(x)):+.3f}", f"{float(jnp.std(x)):.3f}"]
                           for n, x, lay in (("query", q, "BTNH"), ("key", k, "BSKH"), ("value", v, "BSKH"))]))
    s.facts = {"shape_q": list(q.shape), "dtype": str(q.dtype)}
    return s


def step_naive(ctx: LabContext) -> Section:
    cfg = ctx.cfg
    q, k, v = _qkv(cfg)
    out = jax.jit(lambda q, k, v: api.attention(q, k, v, implementation="naive"))(q, k, v)
    verdict = check_close(out, q, k, v)
    s = Section("naive", "3. Attention written out")
    s.paragraphs.append("Four steps: scores = QKᵀ, scale by 1/√H and softmax in float32, weight the values, "
                        "return in the input dtype. Checked against attnlab's NumPy float64 reference.")
    s.tables.append(Table("Naive attention", ["output shape", "dtype", "rel L2 vs float64", "limit", "correct"],
                          [[str(tuple(out.shape)), str(out.dtype), f"{verdict.rel_err:.2e}", f"{verdict.limit:.0e}", "yes" if verdict.ok else "NO"]]))
    s.facts = {"rel_err": verdict.rel_err, "correct": verdict.ok}
    if not verdict.ok:
        s.status, s.reason = "failed", f"naive attention is wrong: {verdict.rule}, got {verdict.rel_err:.2e}"
    return s


def step_jax_nn(ctx: LabContext) -> Section:
    cfg = ctx.cfg
    q, k, v = _qkv(cfg)
    naive = jax.jit(lambda q, k, v: api.attention(q, k, v, implementation="naive"))(q, k, v)
    fn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v)  # noqa: E731 - the codelab's call
    out = jax.jit(fn)(q, k, v)
    diff = float(jnp.max(jnp.abs(out.astype(jnp.float32) - naive.astype(jnp.float32))))
    close = bool(np.allclose(np.asarray(out), np.asarray(naive), atol=1e-5, rtol=1e-5))
    cudnn = hlo_uses_cudnn(fn, q, k, v)
    s = Section("jax_nn", "4. jax.nn.dot_product_attention against naive")
    s.paragraphs.append("jax.nn.dot_product_attention with its default implementation=None runs XLA, not cuDNN; "
                        "the lowered program shows which kernel ran.")
    s.tables.append(Table("jax.nn default vs naive (float32)", ["max |diff|", "allclose (1e-5)", "kernel"],
                          [[f"{diff:.2e}", "yes" if close else "no", "cuDNN fused attention" if cudnn else "XLA (no __cudnn$fmha call)"]]))
    s.facts = {"max_abs_diff": diff, "allclose": close, "cudnn_in_hlo": cudnn}
    return s


def step_cudnn(ctx: LabContext) -> Section:
    cfg = ctx.cfg
    q, k, v = _qkv(cfg, "bfloat16")
    s = Section("cudnn", "5. Forcing cuDNN (bfloat16)")
    spec = prepare(q, k, v).spec
    why = backends.get("cudnn").why_not(spec)
    if why:
        s.status, s.reason = "skipped", f"cudnn: {why}"
        s.paragraphs.append(f"The cuDNN probe says: {why}.")
        s.facts = {"cudnn_available": False}
        return s
    fn = lambda q, k, v: api.attention(q, k, v, implementation="cudnn")  # noqa: E731
    out = jax.jit(fn)(q, k, v)
    xla = jax.jit(lambda q, k, v: api.attention(q, k, v, implementation="xla"))(q, k, v)
    ran = hlo_uses_cudnn(fn, q, k, v)
    ref = reference_attention(q, k, v)
    v_cudnn = check_close(out, q, k, v, ref=ref)
    v_xla = check_close(xla, q, k, v, ref=ref)
    diff = float(jnp.max(jnp.abs(out.astype(jnp.float32) - xla.astype(jnp.float32))))
    s.tables.append(Table("cuDNN vs XLA in bfloat16", ["path", "rel L2 vs float64", "limit", "correct", "kernel"],
                          [["cudnn", f"{v_cudnn.rel_err:.2e}", f"{v_cudnn.limit:.1e}", "yes" if v_cudnn.ok else "NO", "__cudnn$fmha" if ran else "NOT cuDNN"],
                           ["xla", f"{v_xla.rel_err:.2e}", f"{v_xla.limit:.1e}", "yes" if v_xla.ok else "NO", "XLA"]]))
    s.paragraphs.append(f"max |cuDNN − XLA| = {diff:.3e}.")
    s.facts = {"cudnn_available": True, "cudnn_in_hlo": ran, "rel_err_cudnn": v_cudnn.rel_err,
               "rel_err_xla": v_xla.rel_err, "max_abs_diff_cudnn_xla": diff}
    if not (ran and v_cudnn.ok):
        s.status, s.reason = "failed", "cuDNN did not run" if not ran else "cuDNN output incorrect"
    return s


def step_causal(ctx: LabContext) -> Section:
    cfg = ctx.cfg
    q, k, v = _qkv(cfg)

    @jax.jit
    def both(q, k, v):   # one compiled program, not a dispatch of each op
        full, causal = api.attention(q, k, v), api.attention(q, k, v, is_causal=True)
        d = jnp.abs(full.astype(jnp.float32) - causal.astype(jnp.float32))
        return causal, jnp.max(d[:, 0]), jnp.max(d[:, -1])

    causal, d0, dl = both(q, k, v)
    d0, dl = float(d0), float(dl)
    v_c = check_close(causal, q, k, v, is_causal=True)
    s = Section("causal", "6. The causal mask's effect")
    s.paragraphs.append("With is_causal=True query t sees keys s ≤ t. Position 0 sees only itself, so it differs "
                        "greatly from unmasked attention; the last position sees every key, so it hardly differs.")
    s.tables.append(Table("Causal vs unmasked", ["position", "max |causal − unmasked|"],
                          [["0", f"{d0:.3e}"], [str(cfg.q_len - 1), f"{dl:.3e}"]]))
    s.tables.append(Table("Causal vs float64 reference", ["rel L2", "limit", "correct"],
                          [[f"{v_c.rel_err:.2e}", f"{v_c.limit:.0e}", "yes" if v_c.ok else "NO"]]))
    s.facts = {"diff_pos0": d0, "diff_last": dl, "rel_err": v_c.rel_err, "correct": v_c.ok}
    if not v_c.ok or not (d0 > 100 * max(dl, 1e-7)):
        s.status, s.reason = "failed", "causal output wrong or its effect not as expected"
    return s


BASICS = {
    "environment": step_environment,
    "qkv": step_qkv,
    "naive": step_naive,
    "jax_nn": step_jax_nn,
    "cudnn": step_cudnn,
    "causal": step_causal,
}
