"""Check on a CPU that the serving kernel's tile classes compile with Triton for sm_90 (no GPU needed).

    PYTHONPATH=src python3 benchmarks/serving/ttir_cpu.py OUT_DIR --triton-python /path/to/venv/bin/python [--grid | --ports]

Lowers ``kernels.serving`` for the benchmark's shapes (B=32, S=32768, H=128, bf16; G=4 T=1, G=7 T=4,
a mixed batch's prefill class; contiguous and paged 16/64) under an abstract H200
(``kernels.decode.cuda_lowering_context``), keeps each Triton IR and, with ``--triton-python`` (pip's
triton 3.6.0), compiles it for sm_90 and reports shared memory, registers, spills, wgmma or mma.sync
and cp.async pipelining (``benchmarks/decode/ttir_cpu.py``'s ``COMPILE``). A strong hint, not a proof: XLA compiles
the same IR with jaxlib's own Triton.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", ".."))   # the repository root: benchmarks.decode


#: ``--grid``: the serving grid's extreme tiles (``grid_gpu.py``): (B, S, H, N, K, T, max_q_len, page)
GRID_SHAPES = ((32, 32768, 128, 128, 8, 8, 8, None), (32, 32768, 128, 96, 8, 8, 8, 16), (32, 32768, 128, 8, 8, 2, 2, 64),
               (32, 32768, 256, 64, 8, 4, 4, 64), (32, 32768, 256, 32, 8, 1, 1, 16), (32, 32768, 64, 64, 8, 4, 4, 16),
               (128, 16384, 256, 64, 8, 1, None, None), (128, 16384, 128, 128, 8, 1, None, 64))


def shapes(grid: bool):
    """(B, S, H, N, K, T, max_q_len, page) to lower: the benchmark's, or with ``grid`` the serving grid's."""
    if grid:
        return GRID_SHAPES
    return tuple((32, 32768, 128, N, K, T, max_q, page) for (N, K, T, max_q) in ((32, 8, 1, 1), (56, 8, 4, 4), (32, 8, 1, None))
                 for page in (None, 16, 64))


def dump(out_dir: str, grid: bool = False) -> list[str]:
    import jax
    import jax.numpy as jnp
    from benchmarks.decode.ttir_cpu import triton_modules

    from attnlab.kernels import decode as kd
    from attnlab.kernels import serving as ks
    from attnlab.kernels.serving_plan import ServingConfig, make_serving_plan

    s = jax.ShapeDtypeStruct
    tags = []
    with triton_modules() as captured:
        for (B, S, H, N, K, T, max_q, page) in shapes(grid):
            Ttot = B * T
            cfg = ServingConfig(max_q_len=max_q, decode_q_len=T)

            def f(q, k, v, a, b, t=None):
                plan = make_serving_plan(a, b, total_tokens=Ttot, kv_len_max=S, heads=N, kv_heads=K, head_dim=H,
                                         config=cfg, sms=132)
                return ks.serving_attention_pallas(q, k, v, a, b, plan=plan, page_table=t, interpret=False)

            kv = ((B, S, K, H) if page is None else (B * S // page, page, K, H))
            args = [s((Ttot, N, H), jnp.bfloat16), s(kv, jnp.bfloat16), s(kv, jnp.bfloat16),
                    s((B + 1,), jnp.int32), s((B,), jnp.int32)]
            if page:
                args.append(s((B, S // page), jnp.int32))
            n0 = len(captured)
            with kd.cuda_lowering_context():
                jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
            plan = jax.eval_shape(lambda a, b: make_serving_plan(a, b, total_tokens=Ttot, kv_len_max=S, heads=N,
                                                                kv_heads=K, head_dim=H, config=cfg, sms=132),
                                  args[3], args[4])
            # the classes' pieces kernels, then their merges
            n = len(plan.classes)
            for i, cp in enumerate(plan.classes):
                base = (f"{f'H{H}_' if grid else ''}G{N // K}_T{T}_r{cp.block_r}_"
                        f"{'contig' if page is None else f'paged{page}'}")
                stages = kd.compiled_stages(cp.num_stages, 0 if page is None else 1)
                for tag, ttir, meta in ((base, captured[n0 + i], dict(num_warps=cp.num_warps, num_stages=stages)),
                                        (base + "_merge", captured[n0 + n + i], dict(num_warps=8 if cp.block_r * H > 8192 else 4, num_stages=1))):
                    with open(os.path.join(out_dir, tag + ".ttir"), "w") as fh:
                        fh.write(ttir)
                    with open(os.path.join(out_dir, tag + ".json"), "w") as fh:
                        json.dump(meta, fh)
                    tags.append(tag)
    return tags


#: ``--ports``: (name, N, K, T, max_q_len, page, cache dtype or None, kv_mma, window left, window_from_key) at B=32,
#: S=32768, H=128: an FP8 cache's decode tiles with products in q's dtype and float16, windowed tiles (decode and a
#: mixed batch's prefill class) from the first key and from its block
PORTS = tuple((f"fp8_G{N // 8}_T{T}_{mma}", N, 8, T, T, page, "float8_e4m3fn", mma, None, True)
              for N, T in ((32, 1), (56, 4)) for page in (None, 16) for mma in ("q", "float16")) + tuple(
    (f"w128_T{T}_{'key' if key else 'block'}", 32, 8, T, mq, page, None, None, 128, key)
    for T, mq in ((1, 1), (4, 4), (1, None)) for page in (None, 16) for key in (True, False))


def dump_ports(out_dir: str) -> list[str]:
    """Lowers ``PORTS`` (the last class of each: the decode class, or a mixed batch's prefill class)."""
    import jax
    import jax.numpy as jnp
    from benchmarks.decode.ttir_cpu import triton_modules

    from attnlab.kernels import decode as kd
    from attnlab.kernels import serving as ks
    from attnlab.kernels.serving_plan import ServingConfig, make_serving_plan

    s, B, S, H = jax.ShapeDtypeStruct, 32, 32768, 128
    tags = []
    with triton_modules() as captured:
        for name, N, K, T, max_q, page, kv_dtype, mma, left, key in PORTS:
            Ttot = B * T + (0 if max_q else 2048)
            cfg = ServingConfig(max_q_len=max_q, decode_q_len=T, kv_mma=mma, window_from_key=key)
            mk = dict(total_tokens=Ttot, kv_len_max=S, heads=N, kv_heads=K, head_dim=H, config=cfg, sms=132,
                      window_left=left, page_size=page)
            scale = "token" if kv_dtype else None

            def f(q, k, v, a, b, t=None, sk=None, sv=None):
                return ks.serving_attention_pallas(q, k, v, a, b, plan=make_serving_plan(a, b, **mk), page_table=t,
                                                   interpret=False, k_scale=sk, v_scale=sv, kv_scale=scale)

            kv = (B, S, K, H) if page is None else (B * S // page, page, K, H)
            cache = s(kv, jnp.dtype(kv_dtype or "bfloat16"))
            args = [s((Ttot, N, H), jnp.bfloat16), cache, cache, s((B + 1,), jnp.int32), s((B,), jnp.int32),
                    s((B, S // page), jnp.int32) if page else None]
            if kv_dtype:
                args += [s(kv[:3], jnp.float32)] * 2
            n0 = len(captured)
            with kd.cuda_lowering_context():
                jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
            plan = jax.eval_shape(lambda a, b: make_serving_plan(a, b, **mk), args[3], args[4])
            cp = plan.classes[-1]
            tag = f"{name}_{'contig' if page is None else f'paged{page}'}" + ("" if max_q else "_prefill")
            with open(os.path.join(out_dir, tag + ".ttir"), "w") as fh:
                fh.write(captured[n0 + len(plan.classes) - 1])
            with open(os.path.join(out_dir, tag + ".json"), "w") as fh:
                json.dump(dict(num_warps=cp.num_warps, num_stages=kd.compiled_stages(cp.num_stages, 0 if page is None
                                                                                     else 1)), fh)
            tags.append(tag)
    return tags


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--triton-python")
    ap.add_argument("--grid", action="store_true", help="the serving grid's extreme tiles (G 12/16 at T 8, H 64/256)")
    ap.add_argument("--ports", action="store_true", help="FP8 products q / float16, W=128 windows from the key / block")
    a = ap.parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    tags = dump_ports(a.out_dir) if a.ports else dump(a.out_dir, a.grid)
    if not a.triton_python:
        print("\n".join(tags))
        return 0
    from benchmarks.decode.ttir_cpu import COMPILE

    subprocess.run([a.triton_python, "-c", COMPILE, a.out_dir], check=True)
    res = json.load(open(os.path.join(a.out_dir, "compiled.json")))
    bad = 0
    for tag in tags:
        t = res.get(tag, {})
        if not t.get("ok"):
            bad += 1
            print(f"{tag:<28} FAILED {t.get('error')}")
            continue
        spill = " SPILLS" if t.get("stack", 0) > 0 else ""
        bad += bool(spill)
        print(f"{tag:<28} smem {t['shared'] // 1024:4d} KB regs {t.get('regs')} "
              f"{'wgmma' if t['wgmma'] else 'mma.sync'} cp.async={t['cp_async']}{spill}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
