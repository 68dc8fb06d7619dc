"""The cuDNN step: forcing cuDNN's fused attention in bfloat16, checked against float64 beside XLA."""
from __future__ import annotations

from ...core.prepare import prepare
from ..render_common import section_renderer
from ..step_types import LabConfig, LabContext, Step, Table, jax_side

TITLE = "Forcing cuDNN (bfloat16)"


def probe(ctx: LabContext) -> dict:
    jx = jax_side()
    jax, jnp, api = jx.jax, jx.jnp, jx.api
    q, k, v = jx.qkv_inputs(ctx.cfg, "bfloat16")
    why = jx.backends.get("cudnn").why_not(prepare(q, k, v).spec)
    if why:
        return {"why": why}
    fn = lambda q, k, v: api.attention(q, k, v, implementation="cudnn")  # noqa: E731
    out = jax.jit(fn)(q, k, v)
    xla = jax.jit(lambda q, k, v: api.attention(q, k, v, implementation="xla"))(q, k, v)
    ran = jx.hlo_uses_cudnn(fn, q, k, v)
    ref = jx.reference_attention(q, k, v)
    v_cudnn = jx.check_close(out, q, k, v, ref=ref)
    v_xla = jx.check_close(xla, q, k, v, ref=ref)
    diff = float(jnp.max(jnp.abs(out.astype(jnp.float32) - xla.astype(jnp.float32))))
    verdict = lambda x: {"rel_err": x.rel_err, "limit": x.limit, "ok": bool(x.ok)}  # noqa: E731
    return {"why": None, "cudnn_in_hlo": bool(ran), "cudnn": verdict(v_cudnn), "xla": verdict(v_xla), "max_abs_diff": diff}


@section_renderer("cudnn", TITLE)
def render(s, p, records, cfg: LabConfig, plots_dir=None) -> None:
    if p.get("why"):
        s.status, s.reason = "skipped", f"cudnn: {p['why']}"
        s.paragraphs.append(f"The cuDNN probe says: {p['why']}.")
        s.facts = {"cudnn_available": False}
        return
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


STEP = Step("cudnn", TITLE, render, probe=probe)
