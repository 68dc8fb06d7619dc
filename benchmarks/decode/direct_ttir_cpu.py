"""On a CPU: the decode kernel's one-split launch (O stored directly) against partials + combine, compiled for sm_90.

    PYTHONPATH=src python3 benchmarks/decode/direct_ttir_cpu.py OUT_DIR --triton-python /path/to/venv/bin/python

Lowers (abstract H200, ``kernels.decode.cuda_lowering_context``) attnlab's Triton decode kernel at gpt-oss's
windowed decode (B=256, S=32768, N/K=64/8, H=64, bf16, window (128, 0): one split), T = 1 and 4, contiguous and
paged 16, with ``DecodeConfig()`` (``kernels.decode_direct``: normalised in registers, stored in q's dtype into
(B, T, N, H), one kernel) and ``DecodeConfig(direct_output=False)`` (float32 partials, then XLA's combine); plus
the direct launch with sinks. With ``--triton-python`` (pip's triton 3.6.0) compiles each Triton IR for sm_90
(``ttir_cpu.COMPILE``) and prints shared memory, registers, spills and MMA beside each other: the direct
store's epilogue should cost no registers past a spill. A strong hint, not a proof: XLA compiles the same IR
with jaxlib's own Triton.
"""
from __future__ import annotations

import functools
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", ".."))   # the repository root: benchmarks.decode

B, S, N, K, H, WINDOW = 256, 32768, 64, 8, 64, (128, 0)


def dump(out_dir: str) -> list[str]:
    """Lower every case; write OUT_DIR/<tag>.ttir and .json (its launch); return the tags."""
    import jax
    import jax.numpy as jnp
    from benchmarks.decode.ttir_cpu import triton_modules

    from attnlab.kernels import decode as kd

    s, bf, tags = jax.ShapeDtypeStruct, jnp.bfloat16, []
    cases = [(T, page, direct, False) for T in (1, 4) for page in (None, 16) for direct in (True, False)]
    with triton_modules() as captured:
        for T, page, direct, sinks in cases + [(1, None, True, True)]:
            plan = kd.make_plan(B, T, S, N, K, H, "bfloat16", kd.DecodeConfig(direct_output=direct), sms=132,
                                compute_capability=(9, 0), window=WINDOW)
            kv = (B, S, K, H) if page is None else (B * S // page, page, K, H)
            f = jax.jit(functools.partial(kd.decode_attention_pallas, interpret=False, plan=plan, window=WINDOW))
            extra = {} if page is None else dict(page_table=s((B, S // page), jnp.int32))
            if sinks:
                extra["sinks"] = s((N,), jnp.float32)
            with kd.cuda_lowering_context():
                f.trace(s((B, T, N, H), bf), s(kv, bf), s(kv, bf), s((B,), jnp.int32), **extra).lower(
                    lowering_platforms=("cuda",))
            tag = (f"T{T}_{'contig' if page is None else f'paged{page}'}_{'direct' if plan.direct else 'combine'}"
                   + ("_sinks" if sinks else ""))
            with open(os.path.join(out_dir, tag + ".ttir"), "w") as fh:
                fh.write(captured[-1])
            with open(os.path.join(out_dir, tag + ".json"), "w") as fh:
                json.dump(dict(num_warps=plan.num_warps, splits=plan.num_splits, direct=plan.direct,
                               num_stages=kd.compiled_stages(plan.num_stages, 0 if page is None else 1)), fh)
            tags.append(tag)
    return tags


def main(argv=None):
    from benchmarks.decode.ttir_cpu import compile_main

    return compile_main(argv, dump, description=__doc__.splitlines()[0],
                        title="The one-split decode launch compiled by Triton 3.6.0 for sm_90 (on a CPU)",
                        script="benchmarks/decode/direct_ttir_cpu.py")


if __name__ == "__main__":
    sys.exit(main())
