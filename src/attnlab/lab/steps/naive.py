"""The naive step: attention written out (naive: QKᵀ, softmax, weighted values), checked against float64."""
from __future__ import annotations

from ..step_types import LabConfig, LabContext, Step, Table, jax_side
from ..render_common import section_renderer

TITLE = "Attention written out"


def probe(ctx: LabContext) -> dict:
    jx = jax_side()
    q, k, v = jx.qkv_inputs(ctx.cfg)
    out = jx.jax.jit(lambda q, k, v: jx.api.attention(q, k, v, implementation="naive"))(q, k, v)
    verdict = jx.check_close(out, q, k, v)
    return {"shape": list(out.shape), "dtype": str(out.dtype), "rel_err": verdict.rel_err, "limit": verdict.limit,
            "ok": bool(verdict.ok), "rule": verdict.rule}


@section_renderer("naive", TITLE)
def render(s, p, records, cfg: LabConfig, plots_dir=None) -> None:
    s.paragraphs.append("Four steps: scores = QKᵀ, scale by 1/√H and softmax in float32, weight the values, "
                        "return in the input dtype. Checked against attnlab's NumPy float64 reference.")
    s.tables.append(Table("Naive attention", ["output shape", "dtype", "rel L2 vs float64", "limit", "correct"],
                          [[str(tuple(p["shape"])), p["dtype"], f"{p['rel_err']:.2e}", f"{p['limit']:.0e}", "yes" if p["ok"] else "NO"]]))
    s.facts = {"rel_err": p["rel_err"], "correct": p["ok"]}
    if not p["ok"]:
        s.status, s.reason = "failed", f"naive attention is wrong: {p['rule']}, got {p['rel_err']:.2e}"


STEP = Step("naive", TITLE, render, probe=probe)
