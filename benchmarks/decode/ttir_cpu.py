"""Check on a CPU that every decode-kernel variant the tuner will try compiles with Triton for sm_90.

    PYTHONPATH=src python3 benchmarks/decode/ttir_cpu.py OUT_DIR --triton-python /path/to/venv/bin/python

Step 1 (this Python, no GPU needed): lower each variant of ``attnlab.sweep.decode_tune``'s shapes and grids
with ``lowering_platforms=("cuda",)`` (JAX >= 0.11 under an abstract H200 device:
``kernels.decode.cuda_lowering_context``) and keep the Triton IR that Pallas emits
(``OUT_DIR/*.ttir``).
Step 2 (``--triton-python``: a venv with ``pip install triton==3.6.0``, no torch, no GPU):
compile each IR for sm_90 and report shared memory, registers and spills (ptxas, via
cuobjdump), whether wgmma or mma.sync was used, and failures. XLA compiles the same IR with
the Triton bundled in jaxlib, not pip's, so this is a strong hint, not a proof.
Writes OUT_DIR/ttir_check.json and prints a table.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))
sys.path.insert(0, HERE)

COMPILE = r'''
import glob, json, os, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
out_dir = sys.argv[1]
objdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
res = {}
for path in sorted(glob.glob(os.path.join(out_dir, "*.ttir"))):
    tag = os.path.basename(path)[:-5]
    meta = json.load(open(path[:-5] + ".json"))
    try:
        k = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=meta["num_warps"], num_stages=meta["num_stages"]))
        ptx = k.asm["ptx"]
        r = dict(ok=True, shared=k.metadata.shared, wgmma=ptx.count("wgmma.mma_async") > 0, mma_sync=ptx.count("mma.sync") > 0,
                 cp_async=ptx.count("cp.async") > 0)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"]); f.flush()
            usage = subprocess.run([objdump, "-res-usage", f.name], capture_output=True, text=True).stdout
        for line in usage.splitlines():
            if "REG:" in line:
                parts = dict(p.split(":") for p in line.split() if ":" in p)
                r["regs"], r["stack"] = int(parts.get("REG", -1)), int(parts.get("STACK", -1))
    except Exception as e:
        r = dict(ok=False, error=f"{type(e).__name__}: {str(e)[:500]}")
    res[tag] = r
json.dump(res, open(os.path.join(out_dir, "compiled.json"), "w"), indent=1)
'''


@contextlib.contextmanager
def triton_modules():
    """The Triton modules (TTIR text) Pallas lowers inside the block, appended to the yielded list."""
    import jax._src.pallas.triton.pallas_call_registration as reg

    captured, orig = [], reg.lowering.lower_jaxpr_to_triton_module

    def keep(*a, **k):
        res = orig(*a, **k)
        captured.append(res.module.operation.get_asm(enable_debug_info=False))
        return res

    reg.lowering.lower_jaxpr_to_triton_module = keep
    try:
        yield captured
    finally:
        reg.lowering.lower_jaxpr_to_triton_module = orig


def dump(out_dir: str) -> dict:
    import jax
    import jax.numpy as jnp

    from attnlab.sweep import decode_tune
    from attnlab.kernels import decode as kd

    s = jax.ShapeDtypeStruct
    variants = {}
    with triton_modules() as captured:
        for sh in decode_tune.shapes():
            dt = jnp.dtype(sh.dtype)
            B, T, S, N, K, H = decode_tune.sizes(sh)
            base = kd.make_plan(B, T, S, N, K, H, sh.dtype, sms=132, compute_capability=(9, 0))
            for i, cfg in enumerate([{}] + decode_tune.tune_grid(sh, base)):
                plan = kd.make_plan(B, T, S, N, K, H, sh.dtype, kd.DecodeConfig(**cfg), sms=132,
                                    compute_capability=(9, 0))
                tag = f"{decode_tune.group(sh)}_T{T}_B{B}_S{S}" + ("_ragged" if sh.kv_lengths else "") + f"_v{i}"
                f = jax.jit(functools.partial(kd.decode_attention_pallas, causal=True, interpret=False, plan=plan))
                try:
                    with kd.cuda_lowering_context():
                        f.trace(s((B, T, N, H), dt), s((B, S, K, H), dt),
                                s((B, S, K, H), dt), s((B,), jnp.int32)).lower(lowering_platforms=("cuda",))
                except Exception as e:  # noqa: BLE001
                    variants[tag] = dict(config=cfg, plan=dataclasses.asdict(plan), lowered=False, error=f"{type(e).__name__}: {e}")
                    continue
                with open(os.path.join(out_dir, tag + ".ttir"), "w") as fh:
                    fh.write(captured[-1])
                with open(os.path.join(out_dir, tag + ".json"), "w") as fh:
                    json.dump(dict(num_warps=plan.num_warps, num_stages=plan.num_stages), fh)
                variants[tag] = dict(config=cfg, plan=dataclasses.asdict(plan), lowered=True)
    return variants


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--triton-python", help="a Python with pip's triton (step 2); without it, step 1 only")
    a = ap.parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    variants = dump(a.out_dir)
    if a.triton_python:
        subprocess.run([a.triton_python, "-c", COMPILE, a.out_dir], check=True)
        with open(os.path.join(a.out_dir, "compiled.json")) as fh:
            compiled = json.load(fh)
        for tag, v in variants.items():
            v["triton"] = compiled.get(tag)
    with open(os.path.join(a.out_dir, "ttir_check.json"), "w") as fh:
        json.dump(variants, fh, indent=1)
    bad = 0
    for tag, v in variants.items():
        t = v.get("triton") or {}
        p = v["plan"]
        cfg = f"bk={p['block_k']} br={p['block_r']} w={p['num_warps']} st={p['num_stages']} sp={p['num_splits']}"
        if not v["lowered"] or (t and not t.get("ok")):
            bad += 1
            print(f"{tag:<34} {cfg:<36} FAILED {v.get('error') or t.get('error')}")
        elif t:
            spill = " SPILLS" if t.get("stack", 0) > 0 else ""
            over = " SMEM>227KB" if t["shared"] > 227 * 1024 else ""
            bad += bool(spill or over)
            print(f"{tag:<34} {cfg:<36} smem {t['shared'] // 1024:4d} KB regs {t.get('regs')} "
                  f"{'wgmma' if t['wgmma'] else 'mma.sync'}{spill}{over}")
        else:
            print(f"{tag:<34} {cfg:<36} lowered")
    print(f"{len(variants)} variants, {bad} failed, spilled or over the shared-memory limit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())


def compile_main(argv, dump_fn, *, description: str, title: str, script: str, cp_async: bool = False) -> int:
    """The command line of a script that dumps kernels' TTIR (``dump_fn(out_dir)`` -> tags) and, with
    ``--triton-python``, compiles them for sm_90 (``COMPILE``) into a table in OUT/README.md (``title``; ``script``
    the command's path; ``cp_async``: a cp.async column). 1 where a kernel failed or spilled."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("out_dir")
    ap.add_argument("--triton-python", help="a Python with pip's triton 3.6.0; without it, the lowering only")
    a = ap.parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    tags = dump_fn(a.out_dir)
    if not a.triton_python:
        print("\n".join(tags))
        return 0
    subprocess.run([a.triton_python, "-c", COMPILE, a.out_dir], check=True)
    res = json.load(open(os.path.join(a.out_dir, "compiled.json")))
    cols = ["kernel", "shared KB", "registers", "spills", "MMA"] + (["cp.async"] if cp_async else [])
    bad, lines = 0, ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for tag in tags:
        t = res.get(tag, {})
        if not t.get("ok"):
            bad += 1
            lines.append(f"| {tag} | FAILED: {t.get('error', '')[:80]} |" + " |" * (len(cols) - 2))
            continue
        bad += t.get("stack", 0) > 0
        lines.append(f"| {tag} | {t['shared'] // 1024} | {t.get('regs')} | {t.get('stack', 0)} | "
                     f"{'wgmma' if t['wgmma'] else 'mma.sync'} |" + (f" {t['cp_async']} |" if cp_async else ""))
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out_dir, "README.md"), "w") as fh:
        fh.write(f"# {title}\n\n`PYTHONPATH=src python3 {script} {a.out_dir} --triton-python ...`\n\n" + table)
    print(table)
    return 1 if bad else 0
