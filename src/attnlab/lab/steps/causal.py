"""The causal step: the causal mask's effect: large at position 0 (sees itself only), none at the last position."""
from __future__ import annotations

from ..step_types import LabConfig, LabContext, Step, Table, jax_side
from ..render_common import section_renderer

TITLE = "The causal mask's effect"


def probe(ctx: LabContext) -> dict:
    jx = jax_side()
    jnp = jx.jnp
    q, k, v = jx.qkv_inputs(ctx.cfg)

    @jx.jax.jit
    def both(q, k, v):   # one compiled program, not a dispatch of each op
        full, causal = jx.api.attention(q, k, v), jx.api.attention(q, k, v, is_causal=True)
        d = jnp.abs(full.astype(jnp.float32) - causal.astype(jnp.float32))
        return causal, jnp.max(d[:, 0]), jnp.max(d[:, -1])

    causal, d0, dl = both(q, k, v)
    v_c = jx.check_close(causal, q, k, v, is_causal=True)
    return {"diff_pos0": float(d0), "diff_last": float(dl), "rel_err": v_c.rel_err, "limit": v_c.limit,
            "correct": bool(v_c.ok)}


@section_renderer("causal", TITLE)
def render(s, p, records, cfg: LabConfig, plots_dir=None) -> None:
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


STEP = Step("causal", TITLE, render, probe=probe)
