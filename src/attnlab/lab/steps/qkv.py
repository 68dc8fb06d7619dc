"""The q, k, v step: the queries, keys and values the probing steps (environment to causal) run on, and their stats."""
from __future__ import annotations

from ..step_types import LabConfig, LabContext, Step, Table, jax_side
from ..render_common import section_renderer

TITLE = "Queries, keys and values"


def probe(ctx: LabContext) -> dict:
    """The inputs every probing step draws (``jax_side.qkv_inputs``): shape, dtype, layout, mean and std."""
    jx = jax_side()
    jnp = jx.jnp
    q, k, v = jx.qkv_inputs(ctx.cfg)
    return {"tensors": [{"name": n, "shape": list(x.shape), "dtype": str(x.dtype), "layout": lay,
                         "mean": float(jnp.mean(x)), "std": float(jnp.std(x))}
                        for n, x, lay in (("query", q, "BTNH"), ("key", k, "BSKH"), ("value", v, "BSKH"))]}


@section_renderer("qkv", TITLE)
def render(s, p, records, cfg: LabConfig, plots_dir=None) -> None:
    s.paragraphs.append("Layout BTNH for the query and BSKH for key and value: batch, sequence, heads, head dim. "
                        "Inputs are drawn from a standard normal distribution (never zeros, which hide bugs).")
    ts = p["tensors"]
    s.tables.append(Table("Inputs", ["tensor", "shape", "dtype", "layout", "mean", "std"],
                          [[t["name"], str(tuple(t["shape"])), t["dtype"], t["layout"], f"{t['mean']:+.3f}", f"{t['std']:.3f}"]
                           for t in ts]))
    s.facts = {"shape_q": list(ts[0]["shape"]), "dtype": ts[0]["dtype"]}


STEP = Step("qkv", TITLE, render, probe=probe)
