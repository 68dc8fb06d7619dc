"""The jax.nn step: jax.nn.dot_product_attention's default against naive, and which kernel its program calls."""
from __future__ import annotations

import numpy as np

from ..render_common import section_renderer
from ..step_types import LabConfig, LabContext, Step, Table, jax_side

TITLE = "jax.nn.dot_product_attention against naive"


def probe(ctx: LabContext) -> dict:
    jx = jax_side()
    jax, jnp = jx.jax, jx.jnp
    q, k, v = jx.qkv_inputs(ctx.cfg)
    naive = jax.jit(lambda q, k, v: jx.api.attention(q, k, v, implementation="naive"))(q, k, v)
    fn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v)  # noqa: E731 - the codelab's call
    out = jax.jit(fn)(q, k, v)
    diff = float(jnp.max(jnp.abs(out.astype(jnp.float32) - naive.astype(jnp.float32))))
    close = bool(np.allclose(np.asarray(out), np.asarray(naive), atol=1e-5, rtol=1e-5))
    return {"max_abs_diff": diff, "allclose": close, "cudnn_in_hlo": bool(jx.hlo_uses_cudnn(fn, q, k, v))}


@section_renderer("jax_nn", TITLE)
def render(s, p, records, cfg: LabConfig, plots_dir=None) -> None:
    s.paragraphs.append("jax.nn.dot_product_attention with its default implementation=None runs XLA, not cuDNN; "
                        "the lowered program shows which kernel ran.")
    s.tables.append(Table("jax.nn default vs naive (float32)", ["max |diff|", "allclose (1e-5)", "kernel"],
                          [[f"{p['max_abs_diff']:.2e}", "yes" if p["allclose"] else "no",
                            "cuDNN fused attention" if p["cudnn_in_hlo"] else "XLA (no __cudnn$fmha call)"]]))
    s.facts = {"max_abs_diff": p["max_abs_diff"], "allclose": p["allclose"], "cudnn_in_hlo": p["cudnn_in_hlo"]}


STEP = Step("jax_nn", TITLE, render, probe=probe)
