"""Check on a CPU how the paged decode kernel compiles for sm_90 (no GPU): cp.async, MMA kind, shared memory.

    PYTHONPATH=src python3 benchmarks/decode/paged_ttir_cpu.py OUT_DIR --triton-python /path/to/venv/bin/python  (without it: the lowering only)

Lowers the kernel for B=8, S=32768, GQA 32/8, H=128, T=4 contiguous and paged at page sizes 16,
64 and 128 (block_k 64: a per-key gather, one page, part of a page) and compiles each Triton IR
with pip's triton 3.6 (``benchmarks/decode/ttir_cpu.py``'s ``COMPILE``). A hint for the H200, not a measurement.
"""
from __future__ import annotations

import functools
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))
sys.path.insert(0, HERE)


def dump(out_dir: str) -> list[str]:
    import jax
    import jax.numpy as jnp
    from ttir_cpu import triton_modules

    from attnlab.kernels import decode as kd

    s = jax.ShapeDtypeStruct
    B, T, S, N, K, H = 8, 4, 32768, 32, 8, 128
    plan = kd.make_plan(B, T, S, N, K, H, "bfloat16", sms=132, compute_capability=(9, 0))
    tags = []
    with triton_modules() as captured:
        for ps in (None, 16, 64, 128):
            f = jax.jit(functools.partial(kd.decode_attention_pallas, causal=True, interpret=False, plan=plan))
            q = s((B, T, N, H), jnp.bfloat16)
            if ps is None:
                args, kw = (q, s((B, S, K, H), jnp.bfloat16), s((B, S, K, H), jnp.bfloat16), s((B,), jnp.int32)), {}
            else:
                P = B * S // ps
                args = (q, s((P, ps, K, H), jnp.bfloat16), s((P, ps, K, H), jnp.bfloat16), s((B,), jnp.int32))
                kw = {"page_table": s((B, S // ps), jnp.int32)}
            with kd.cuda_lowering_context():
                f.trace(*args, **kw).lower(lowering_platforms=("cuda",))
            tag = "contiguous" if ps is None else f"paged{ps}"
            with open(os.path.join(out_dir, tag + ".ttir"), "w") as fh:
                fh.write(captured[-1])
            with open(os.path.join(out_dir, tag + ".json"), "w") as fh:
                json.dump(dict(num_warps=plan.num_warps,   # what the kernel passes Triton (issue 25)
                               num_stages=kd.compiled_stages(plan.num_stages, 0 if ps is None else 1)), fh)
            tags.append(tag)
    return tags


def main(argv=None) -> int:
    from ttir_cpu import compile_main

    return compile_main(argv, dump, description=__doc__.splitlines()[0], cp_async=True,
                        title="The paged decode kernel compiled for sm_90 on a CPU",
                        script="benchmarks/decode/paged_ttir_cpu.py")


if __name__ == "__main__":
    sys.exit(main())
