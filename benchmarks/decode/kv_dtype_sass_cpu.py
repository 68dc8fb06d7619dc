"""On a CPU: what an FP8 cache costs the decode kernel in instructions, from its sm_90 machine code (no GPU needed).

    PYTHONPATH=src python3 benchmarks/decode/kv_dtype_sass_cpu.py OUT_DIR --triton-python /path/to/venv/bin/python

Lowers attnlab's Triton decode kernel (``kernels.decode``) under an abstract H200 for B=8, S=32768, N/K=32/8,
H=128, q bfloat16 (``kv_dtype_gpu.py``'s shape): the bf16 cache, and e4m3 with per-token scales, products in
float16 and in q's dtype, at T=1 and T=8 (plus T=8 with 16-row tiles and 2 warps, T=1 in 1 and 2 warps).
Compiles each Triton IR for sm_90 with pip's triton 3.6.0 (``ttir_cpu.COMPILE``'s way: XLA compiles the same IR with jaxlib's Triton, so
a strong hint, not a proof), disassembles it (cuobjdump) and counts the instructions of the KV loop (the
longest backward branch: one block of block_k keys per iteration, per warp) by opcode. ``issue_ms``: the time
the SMs need only to issue those instructions, blocks x row tiles x warps x loop / (4 per clock x 1.98 GHz x 132
SMs), beside ``roofline_ms``, the cache's bytes at 4.8 TB/s: a kernel whose issue time nears its byte time is
bound by its instructions, not its bytes.

``toy_*``: a minimal FP8 decode loop (16 or 32 rows, float16 products, no scales, masks or splits) with V as the
cache stores it, (S, H), against V stored transposed, (H, S) (vLLM's older value-cache layout): an FP8 value
block is the PV product's B operand with its keys along the contraction, so (S, H) makes Triton gather it byte
by byte from shared memory (``LDS.U8``), while (H, S) reads it as K is read.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", ".."))

B, S, N, K, H = 8, 32768, 32, 8, 128
#: (tag, T, cache dtype, kv_mma, DecodeConfig extras)
CASES = [(f"T{T}_{name}{suffix}", T, kvd, mma, extra)
         for T in (1, 8)
         for name, kvd, mma in (("bf16", "bfloat16", None), ("e4m3_f16", "float8_e4m3fn", "float16"),
                                ("e4m3_q", "float8_e4m3fn", "q"))
         for suffix, extra in (("", {}), ("_br16", {"block_r": 16}), ("_w2", {"num_warps": 2}))
         if T == 8 or not extra]
#: T=1 in fewer warps (a warp then issues more of a block, the SMs fewer in all) and longer key blocks
CASES += [(f"T1_{name}_w{w}{f'_k{bk}' if bk else ''}", 1, kvd, mma, dict(num_warps=w, **({"block_k": bk} if bk else {})))
          for name, kvd, mma in (("bf16", "bfloat16", None), ("e4m3_f16", "float8_e4m3fn", "float16"))
          for w in (1, 2) for bk in (None, 128)]

SASS = r'''
import glob, json, os, subprocess, sys
import triton
from triton.backends.compiler import GPUTarget
out_dir = sys.argv[1]
objdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
for path in sorted(glob.glob(os.path.join(out_dir, "*.ttir"))):
    meta = json.load(open(path[:-5] + ".json"))
    k = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=meta["num_warps"], num_stages=meta["num_stages"]))
    with open(path[:-5] + ".cubin", "wb") as f:
        f.write(k.asm["cubin"])
    sass = subprocess.run([objdump, "-sass", path[:-5] + ".cubin"], capture_output=True, text=True).stdout
    open(path[:-5] + ".sass", "w").write(sass)
'''


def lower_decode(out_dir: str, tag: str, plan, captured, T: int, kv_dtype: str, kv_scale: str | None) -> None:
    """Lower the decode kernel of ``plan`` for sm_90 (B, S, N, K, H above; q bfloat16, a cache of ``kv_dtype``, its
    scales in the layout ``kv_scale`` or none) inside ``ttir_cpu.triton_modules()`` (``captured``), and write
    OUT_DIR/<tag>.ttir and <tag>.json (its launch)."""
    import jax
    import jax.numpy as jnp

    from attnlab.kernels import decode as kd

    s = jax.ShapeDtypeStruct
    sc = (B, S, K) if kv_scale == "token" else (K,)
    args = [s((B, T, N, H), jnp.bfloat16), *[s((B, S, K, H), jnp.dtype(kv_dtype))] * 2, s((B,), jnp.int32)]
    args += [s(sc, jnp.float32)] * (2 * bool(kv_scale))

    def f(q, k, v, lengths, *scales):
        kw = dict(k_scale=scales[0], v_scale=scales[1], kv_scale=kv_scale) if kv_scale else {}
        return kd.decode_attention_pallas(q, k, v, lengths, causal=True, interpret=False, plan=plan, **kw)

    with kd.cuda_lowering_context():
        jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
    with open(os.path.join(out_dir, tag + ".ttir"), "w") as fh:
        fh.write(captured[-1])
    with open(os.path.join(out_dir, tag + ".json"), "w") as fh:
        json.dump(dict(num_warps=plan.num_warps, num_stages=plan.num_stages), fh)


def dump(out_dir: str) -> dict:
    """Lower every case; write OUT_DIR/<tag>.ttir and .json (its launch); return {tag: plan fields}."""
    from benchmarks.decode.ttir_cpu import triton_modules
    from attnlab.kernels import decode as kd

    plans = {}
    with triton_modules() as captured:
        for tag, T, kvd, mma, extra in CASES:
            quant = kvd != "bfloat16"
            plan = kd.make_plan(B, T, S, N, K, H, "bfloat16", kd.DecodeConfig(kv_mma=mma, kernel="triton", kv_pairs=False, **extra),
                                sms=132, compute_capability=(9, 0), kv_dtype=kvd if quant else None)
            lower_decode(out_dir, tag, plan, captured, T, kvd, "token" if quant else None)
            plans[tag] = dict(T=T, kv_dtype=kvd, products=plan.kv_mma or "q", block_r=plan.block_r,
                              row_tiles=plan.row_tiles, block_k=plan.block_k, num_warps=plan.num_warps,
                              num_stages=plan.num_stages)
    return plans


def toy(q_ref, k_ref, v_ref, o_ref, *, transposed: bool, block_k: int = 64):
    """o = softmax(q k^T) v over the whole cache (no scale, mask or split), the products in float16."""
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    q, (R, H) = q_ref[...].astype(jnp.float16), o_ref.shape

    def body(i, carry):
        m, l, acc = carry
        at = pl.multiple_of(i * block_k, block_k)
        s = plgpu.dot(q, plgpu.load(k_ref.at[pl.ds(at, block_k), :]).astype(jnp.float16), trans_b=True)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        p, alpha = jnp.exp2(s - m_new[:, None]), jnp.exp2(m - m_new)
        if transposed:
            pv = plgpu.dot(p.astype(jnp.float16), plgpu.load(v_ref.at[:, pl.ds(at, block_k)]).astype(jnp.float16),
                           trans_b=True)
        else:
            pv = plgpu.dot(p.astype(jnp.float16), plgpu.load(v_ref.at[pl.ds(at, block_k), :]).astype(jnp.float16))
        return m_new, l * alpha + jnp.sum(p, axis=1), acc * alpha[:, None] + pv

    init = (jnp.full((R,), -1e30, jnp.float32), jnp.zeros((R,), jnp.float32), jnp.zeros((R, H), jnp.float32))
    m, l, acc = lax.fori_loop(0, k_ref.shape[0] // block_k, body, init)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)


def dump_toys(out_dir: str) -> dict:
    """Lower the toy loop at 16 and 32 rows, V (S, H) and (H, S); write its .ttir/.json; return its plan fields."""
    import functools

    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    from benchmarks.decode.ttir_cpu import triton_modules
    from attnlab.kernels import decode as kd

    s, fp8, plans = jax.ShapeDtypeStruct, jnp.float8_e4m3fn, {}
    with triton_modules() as captured:
        for R in (16, 32):
            for transposed in (False, True):
                tag = f"toy_R{R}_{'v_HS' if transposed else 'v_SH'}"
                f = pl.pallas_call(functools.partial(toy, transposed=transposed), out_shape=s((R, H), jnp.bfloat16),
                                   compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=3))
                with kd.cuda_lowering_context():
                    jax.jit(f).trace(s((R, H), jnp.bfloat16), s((S, H), fp8),
                                     s((H, S) if transposed else (S, H), fp8)).lower(lowering_platforms=("cuda",))
                with open(os.path.join(out_dir, tag + ".ttir"), "w") as fh:
                    fh.write(captured[-1])
                with open(os.path.join(out_dir, tag + ".json"), "w") as fh:
                    json.dump(dict(num_warps=4, num_stages=3), fh)
                # one (sequence, KV head) per program, as the decode kernel's grid at B x K programs
                plans[tag] = dict(T=R // (N // K), kv_dtype="float8_e4m3fn", products="float16", block_r=R,
                                  row_tiles=1, block_k=64, num_warps=4, num_stages=3, toy=True)
    return plans


def loops(sass: str):
    """(instructions [(address, opcode without modifiers)], loop spans [(lo, hi)]: a backward branch's target to
    the branch) of cuobjdump's SASS text."""
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass)
    ins = [(int(a, 16), re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]) for a, t in lines]
    spans = [(int(m.group(1), 16), int(a, 16)) for a, t in lines
             if (m := re.search(r"BRA\s.*?0x([0-9a-f]+)", t)) and int(m.group(1), 16) < int(a, 16)]
    return ins, spans


def loop_ops(sass: str) -> collections.Counter:
    """Opcodes of the longest loop (``loops``)."""
    ins, spans = loops(sass)
    lo, hi = max(spans, key=lambda x: x[1] - x[0])
    return collections.Counter(op for a, op in ins if lo <= a <= hi)


def compile_cli(description: str, dump_fn, argv=None, script: str = SASS):
    """(args, what ``dump_fn(out_dir)`` returned): parse ``OUT_DIR --triton-python PY``, lower the kernels
    (``dump_fn`` writes OUT_DIR/<tag>.ttir and .json), then compile and disassemble each (``script``: ``SASS``,
    or one that writes more)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("out_dir")
    ap.add_argument("--triton-python", required=True, help="a Python with pip's triton 3.6.0 (no GPU, no torch)")
    a = ap.parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    meta = dump_fn(a.out_dir)
    subprocess.run([a.triton_python, "-c", script, a.out_dir], check=True)
    return a, meta


def main(argv=None) -> int:
    a, plans = compile_cli(__doc__.splitlines()[0], lambda out: {**dump(out), **dump_toys(out)}, argv)
    rows = {}
    print(f"{'case':<16} {'tile':<14} {'loop':>5} {'issue_ms':>8} {'bytes_ms':>8}  top opcodes per warp and block")
    for tag, p in plans.items():
        ops = loop_ops(open(os.path.join(a.out_dir, tag + ".sass")).read())
        n = sum(ops.values())
        blocks = B * K * (S // p["block_k"]) * p["row_tiles"]
        issue_ms = blocks * p["num_warps"] * n / (4 * 1.98e9 * 132) * 1e3
        fp8 = "float8" in p["kv_dtype"]
        nbytes = 2 * B * S * K * H * (1 if fp8 else 2) + (2 * B * S * K * 4 if fp8 and not p.get("toy") else 0)
        rows[tag] = dict(p, loop_instructions=n, issue_ms=issue_ms, roofline_ms=nbytes / 4.8e12 * 1e3,
                         opcodes=dict(ops.most_common()))
        tile = f"{p['block_r']}x{p['block_k']} w{p['num_warps']}"
        print(f"{tag:<16} {tile:<14} {n:5d} {issue_ms:8.3f} {nbytes / 4.8e9:8.3f}  "
              + " ".join(f"{o}={c}" for o, c in ops.most_common(7)))
    with open(os.path.join(a.out_dir, "loops.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
