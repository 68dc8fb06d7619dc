"""On a CPU: the serving kernel with its merge fused (``ServingConfig(merge="fused")``) against the pieces kernel and
merge kernel it replaces, compiled for sm_90: registers, spills (local memory), instructions.

    PYTHONPATH=src python3 benchmarks/serving/fused_sass_cpu.py OUT_DIR --triton-python /path/to/venv/bin/python

Lowers each case's serving call (B=32, S=32768, K=8, H=128, bf16, the decode class as the H200 grid runs it; a
mixed batch's prefill class; sinks and pages of 16) under an abstract H200 with merge "kernel" and "fused",
compiles every Triton module with pip's triton 3.6.0 (``benchmarks/decode/kv_dtype_sass_cpu.py``'s ``SASS``) and
reads ``cuobjdump -res-usage``: REG (registers a thread), LOCAL (bytes of local memory a thread: spills) and
SHARED; ``sass_cpu.counts``: all instructions a warp, and the largest innermost loop's (the KV loop, or in a
fused module whose merge loop is longer, that). Also checks that the fused module
holds the ticket (an acq_rel GPU-scope atomic add) behind a CTA barrier. Writes fused.json to OUT_DIR.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, ROOT)
from benchmarks.decode.kv_dtype_sass_cpu import compile_cli  # noqa: E402  (after the path)
from benchmarks.serving.sass_cpu import counts  # noqa: E402

B, S, K, H = 32, 32768, 8, 128
#: (tag, G, T, mixed batch, sinks, page size)
CASES = (("G4_T1", 4, 1, False, False, None), ("G7_T4", 7, 4, False, False, None), ("G16_T8", 16, 8, False, False, None),
         ("G4_T1_sinks_p16", 4, 1, False, True, 16), ("mixed_G4", 4, 1, True, False, None))


def dump(out_dir: str) -> dict:
    """<tag>_<merge>_<i>.ttir/.json for each Triton module of each case's call; {name: its launch and kind}."""
    import jax
    import jax.numpy as jnp

    from attnlab.kernels import decode as kd
    from attnlab.kernels import serving as ks
    from attnlab.kernels.serving_plan import ServingConfig, make_serving_plan
    from benchmarks.decode.ttir_cpu import triton_modules

    s, meta = jax.ShapeDtypeStruct, {}
    with triton_modules() as captured:
        for tag, G, T, mixed, sinks, page in CASES:
            N, tokens = G * K, B * T + (2048 if mixed else 0)
            for merge in ("kernel", "fused"):
                cfg = ServingConfig(max_q_len=None if mixed else T, decode_q_len=T, merge=merge)
                mk = dict(total_tokens=tokens, kv_len_max=S, heads=N, kv_heads=K, head_dim=H, config=cfg, sms=132)
                kv = s((B * S // page, page, K, H) if page else (B, S, K, H), jnp.bfloat16)
                args = [s((tokens, N, H), jnp.bfloat16), kv, kv, s((B + 1,), jnp.int32), s((B,), jnp.int32),
                        s((B, S // page) if page else (1,), jnp.int32), s((N,), jnp.float32)]

                def f(q, k, v, a, b, t, sk, mk=mk):
                    return ks.serving_attention_pallas(q, k, v, a, b, plan=make_serving_plan(a, b, **mk, page_size=page),
                                                       page_table=t if page else None, sinks=sk if sinks else None,
                                                       interpret=False)

                n0 = len(captured)
                with kd.cuda_lowering_context():
                    jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
                plan = jax.eval_shape(lambda a, b: make_serving_plan(a, b, **mk, page_size=page), args[3], args[4])
                launches = [(cp, False) for cp in plan.classes] if merge == "fused" else (
                    [(cp, False) for cp in plan.classes] + [(cp, True) for cp in plan.classes])
                for i, (ttir, (cp, is_merge)) in enumerate(zip(captured[n0:], launches)):
                    name = f"{tag}_{merge}_{i}"
                    warps = (8 if cp.block_r * H > 8192 else 4) if is_merge else cp.num_warps
                    stages = 1 if is_merge else kd.compiled_stages(cp.num_stages, 1 if page else 0)
                    with open(os.path.join(out_dir, name + ".ttir"), "w") as fh:
                        fh.write(ttir)
                    with open(os.path.join(out_dir, name + ".json"), "w") as fh:
                        json.dump(dict(num_warps=warps, num_stages=stages), fh)
                    meta[name] = dict(case=tag, merge=merge, kernel="merge" if is_merge else (
                        "decode" if cp.decode else "prefill"), block_r=cp.block_r, block_k=cp.block_k, warps=warps,
                        stages=stages, ticket="tt.atomic_rmw" in ttir and "acq_rel" in ttir and "gpu.barrier" in ttir)
    return meta


def resources(cubin: str, objdump: str) -> dict:
    """REG, STACK, SHARED, LOCAL of the cubin's kernel (``cuobjdump -res-usage``)."""
    text = subprocess.run([objdump, "-res-usage", cubin], capture_output=True, text=True).stdout
    return {k.lower(): int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text)}


def main(argv=None) -> int:
    a, meta = compile_cli(__doc__.splitlines()[0], dump, argv)
    py = subprocess.run([sys.argv[sys.argv.index("--triton-python") + 1] if argv is None else
                         argv[argv.index("--triton-python") + 1], "-c",
                         "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), 'backends', "
                         "'nvidia', 'bin', 'cuobjdump'))"], capture_output=True, text=True, check=True)
    objdump = py.stdout.strip()
    print(f"{'module':<28} {'kernel':<8} {'tile':<12} {'regs':>4} {'local':>5} {'shared':>6} {'instr':>6} "
          f"{'loop':>5}  ticket")
    for name, m in meta.items():
        m.update(resources(os.path.join(a.out_dir, name + ".cubin"), objdump))
        c = counts(open(os.path.join(a.out_dir, name + ".sass")).read())
        m.update(loop=c["loop"], outer=c["outer"], once=c["once"])
        print(f"{name:<28} {m['kernel']:<8} {m['block_r']}x{m['block_k']} w{m['warps']:<3} {m['reg']:4d} "
              f"{m['local']:5d} {m['shared']:6d} {m['loop'] + m['outer'] + m['once']:6d} {m['loop']:5d}  "
              f"{'yes' if m['ticket'] else '-'}")
    with open(os.path.join(a.out_dir, "fused.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
