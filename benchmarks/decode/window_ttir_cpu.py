"""Check on a CPU that the windowed decode and serving kernels compile with Triton for sm_90 as their twins do.

    PYTHONPATH=src python3 benchmarks/decode/window_ttir_cpu.py OUT_DIR --triton-python /path/to/venv/bin/python

Lowers (abstract H200, ``kernels.decode.cuda_lowering_context``) attnlab's decode kernel at gpt-oss's heads
(B=8, S=32768, N/K=64/8, H=64, bf16; T = 1 and 4) and its serving kernel (B=32, S=32768, N/K=32/8, H=128: a
decode class, and a mixed batch's prefill class), contiguous and paged 16, each with a window of 128 and
without; with ``--triton-python`` (pip's triton 3.6.0) compiles each Triton IR for sm_90
(``benchmarks/decode/ttir_cpu.py``'s ``COMPILE``) and prints shared memory, registers, spills, wgmma or
mma.sync and cp.async beside the twin's: the window's compares (and the prefill tile's third loop) should
cost no registers past a spill and no pipelining. A strong hint, not a proof: XLA compiles the same IR with
jaxlib's own Triton.
"""
from __future__ import annotations

import functools
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", ".."))   # the repository root: benchmarks.decode

WINDOW = (128, 0)


def _write(out_dir, tag, ttir, meta):
    with open(os.path.join(out_dir, tag + ".ttir"), "w") as fh:
        fh.write(ttir)
    with open(os.path.join(out_dir, tag + ".json"), "w") as fh:
        json.dump(meta, fh)


def dump(out_dir: str) -> list[str]:
    import jax
    import jax.numpy as jnp
    from benchmarks.decode.ttir_cpu import triton_modules

    from attnlab.kernels import decode as kd
    from attnlab.kernels import serving as ks
    from attnlab.kernels.serving_plan import ServingConfig, make_serving_plan

    s, bf = jax.ShapeDtypeStruct, jnp.bfloat16
    tags = []
    with triton_modules() as captured:
        B, S, N, K, H = 8, 32768, 64, 8, 64
        for T in (1, 4):
            for page in (None, 16):
                for window in (None, WINDOW):
                    plan = kd.make_plan(B, T, S, N, K, H, "bfloat16", sms=132, compute_capability=(9, 0), window=window)
                    kv = (B, S, K, H) if page is None else (B * S // page, page, K, H)
                    f = jax.jit(functools.partial(kd.decode_attention_pallas, interpret=False, plan=plan, window=window))
                    extra = {} if page is None else dict(page_table=s((B, S // page), jnp.int32))
                    with kd.cuda_lowering_context():
                        f.trace(s((B, T, N, H), bf), s(kv, bf), s(kv, bf), s((B,), jnp.int32), **extra).lower(
                            lowering_platforms=("cuda",))
                    tag = f"decode_T{T}_{'contig' if page is None else f'paged{page}'}_{'w128' if window else 'full'}"
                    _write(out_dir, tag, captured[-1], dict(num_warps=plan.num_warps, num_stages=kd.compiled_stages(
                        plan.num_stages, 0 if page is None else 1), splits=plan.num_splits))
                    tags.append(tag)
        B, S, N, K, H = 32, 32768, 32, 8, 128
        for name, T_tot, max_q in (("decode", B, 1), ("prefill", B + 2048, None)):
            for page in (None, 16):
                for left in (None, WINDOW[0]):
                    cfg = ServingConfig(max_q_len=max_q)
                    plan = jax.eval_shape(lambda a, b: make_serving_plan(a, b, total_tokens=T_tot, kv_len_max=S, heads=N,
                                                                         kv_heads=K, head_dim=H, config=cfg, sms=132,
                                                                         window_left=left),
                                          s((B + 1,), jnp.int32), s((B,), jnp.int32))
                    cp = plan.classes[-1]          # the decode class, or the mixed batch's prefill class

                    def f(q, k, v, a, b, t=None):
                        p = make_serving_plan(a, b, total_tokens=T_tot, kv_len_max=S, heads=N, kv_heads=K, head_dim=H,
                                              config=cfg, sms=132, window_left=left)
                        return ks.serving_attention_pallas(q, k, v, a, b, plan=p, page_table=t, interpret=False)

                    kv = (B, S, K, H) if page is None else (B * S // page, page, K, H)
                    args = [s((T_tot, N, H), bf), s(kv, bf), s(kv, bf), s((B + 1,), jnp.int32), s((B,), jnp.int32)]
                    args += [] if page is None else [s((B, S // page), jnp.int32)]
                    n0 = len(captured)
                    with kd.cuda_lowering_context():
                        jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
                    tag = f"serving_{name}_{'contig' if page is None else f'paged{page}'}_{'w128' if left else 'full'}"
                    _write(out_dir, tag, captured[n0 + len(plan.classes) - 1], dict(
                        num_warps=cp.num_warps, num_stages=kd.compiled_stages(cp.num_stages, 0 if page is None else 1)))
                    tags.append(tag)
    return tags


def main(argv=None):
    from benchmarks.decode.ttir_cpu import compile_main

    return compile_main(argv, dump, description=__doc__.splitlines()[0],
                        title="Windowed kernels compiled by Triton 3.6.0 for sm_90 (on a CPU)",
                        script="benchmarks/decode/window_ttir_cpu.py", cp_async=True)


if __name__ == "__main__":
    sys.exit(main())
