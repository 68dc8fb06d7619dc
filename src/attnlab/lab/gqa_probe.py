"""Step 9's probe: what XLA's compiled program does with MHA, GQA and MQA at the step's shape.

GQA does MHA's FLOPs, so its time differs only by how the program is shaped. The probe reads the
compiled program (nothing is run): its matmuls (count and shape of the scores' dot) and the bytes
its layout copies move (XLA's ``copy`` ops: transposes it materialises). On a CPU these explain a
GQA time that differs from MHA's (the grouped einsum stacks G query heads into one larger matmul,
with copies to lay them out), where a GPU's fused kernel simply reads each key/value head once.
"""
from __future__ import annotations

import re

from .core import LabContext
from .plan import gqa_shape

_OP = re.compile(r"= (\w+)\[([\d,]*)\]\{[^}]*\} (dot|copy)\(")
_ITEMSIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s32": 4, "pred": 1}


def program_facts(hlo_text: str) -> dict:
    """{dots: [[dtype, shape], ...], copy_bytes}: the compiled HLO's dot outputs and the bytes its copy ops write."""
    dots, copy_bytes = [], 0
    for dtype, dims, op in _OP.findall(hlo_text):
        shape = [int(d) for d in dims.split(",") if d]
        if op == "dot":
            dots.append([dtype, shape])
        else:
            n = _ITEMSIZE.get(dtype, 4)
            for d in shape:
                n *= d
            copy_bytes += n
    return {"dots": dots, "copy_bytes": copy_bytes}


def probe_gqa(ctx: LabContext) -> dict:
    """For XLA at each (variant, K) of the step: the compiled program's matmuls and copy bytes."""
    import jax

    from ..api import dot_product as api

    c, g = ctx.cfg, gqa_shape(ctx.cfg)
    out = {}
    if c.quick:   # a smoke test: the compiles are left out
        return {"xla_programs": out}
    for name, K in g["variants"]:
        q = jax.ShapeDtypeStruct((c.batch, g["T"], g["N"], c.head_dim), c.perf_dtype)
        kv = jax.ShapeDtypeStruct((c.batch, g["T"], K, c.head_dim), c.perf_dtype)
        fn = jax.jit(lambda q, k, v: api.attention(q, k, v, implementation="xla", is_causal=g["causal"]))
        try:
            out[name] = {"K": K, **program_facts(fn.lower(q, kv, kv).compile().as_text())}
        except Exception as e:  # noqa: BLE001 - a fact that cannot be read is said, not fatal
            out[name] = {"K": K, "error": f"{type(e).__name__}: {e}"[:200]}
    return {"xla_programs": out}
