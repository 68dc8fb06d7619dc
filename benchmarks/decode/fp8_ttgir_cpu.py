"""On a CPU: why the FP8 cache's decode loop is not bound by its bytes, from Triton's TTGIR, PTX and SASS for sm_90.

    PYTHONPATH=src python3 benchmarks/decode/fp8_ttgir_cpu.py OUT_DIR --triton-python /path/to/venv/bin/python

Lowers (abstract H200, ``kernels.decode.cuda_lowering_context``) attnlab's Triton decode kernel at
``kv_dtype_gpu.py``'s shape (B=8, S=32768, N/K=32/8, H=128, q bfloat16) at T=1 and T=8 (4 and 32 query rows a KV
head): the bf16 cache, and the e4m3 cache with per-token and per-tensor scales, products in float16 (the plan's
default) and in q's dtype, plus ``DecodeConfig(kv_pairs=True)`` (``EXTRA``). Compiles each Triton IR for sm_90 with
pip's triton 3.6.0 (XLA compiles the same IR with jaxlib's Triton: a strong hint, not a proof) and keeps the TTGIR
(after Triton's passes), PTX and SASS, then counts per kernel: shared memory, registers, spills (ptxas' stack),
the TTGIR's ``ttg.convert_layout`` / ``ttg.local_alloc`` / ``local_load`` / ``local_store``, the PTX's
conversions (``cvt`` of 8-bit types), ``ld.global`` / ``cp.async`` widths, ``ld.shared`` by width, ``ldmatrix``,
``bar.sync``; and the SASS instructions of the KV loop per warp and block (``kv_dtype_sass_cpu.loop_ops``).
Writes OUT_DIR/<tag>.{ttir,ttgir,ptx,sass}, counts.json and table.md.
"""
from __future__ import annotations

import collections
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", ".."))   # the repository root: benchmarks.decode

from benchmarks.decode.kv_dtype_sass_cpu import B, H, K, N, S  # noqa: E402,F401 (after sys.path; the same shape)
#: (tag suffix, cache dtype, scale layout, DecodeConfig fields)
BASE = [("bf16", "bfloat16", None, {})] + [
    (f"e4m3_{lay}_{prod}", "float8_e4m3fn", lay, dict(kv_mma=mma, kv_pairs=False))   # read as bytes
    for lay in ("token", "tensor") for prod, mma in (("f16", "float16"), ("q", "q"))]
#: prototype variants (``DecodeConfig`` fields), e4m3 with float16 products
EXTRA = [(f"e4m3_{lay}_f16_pairs", "float8_e4m3fn", lay, dict(kv_mma="float16", kv_pairs=True))
         for lay in ("token", "tensor")]
#: every block masked (``DecodeConfig(whole_blocks=False)``): one loop, against the other cases' unmasked loop of the
#: blocks every row sees whole (``whole_blocks=True``; the table's ``loops``: each loop's instructions, the unmasked
#: one the shorter)
MASKED = [(f"{tag}_masked", kvd, lay, dict(cfg, whole_blocks=False)) for tag, kvd, lay, cfg in [BASE[0], *EXTRA]]

COMPILE = r'''
import glob, json, os, subprocess, sys
import triton
from triton.backends.compiler import GPUTarget
out_dir = sys.argv[1]
bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
res = {}
for path in sorted(glob.glob(os.path.join(out_dir, "*.ttir"))):
    stem, meta = path[:-5], json.load(open(path[:-5] + ".json"))
    try:
        k = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=meta["num_warps"], num_stages=meta["num_stages"]))
    except Exception as e:
        res[os.path.basename(stem)] = dict(ok=False, error=f"{type(e).__name__}: {str(e)[:800]}")
        continue
    for ext in ("ttgir", "ptx"):
        open(f"{stem}.{ext}", "w").write(k.asm[ext])
    open(stem + ".cubin", "wb").write(k.asm["cubin"])
    sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", stem + ".cubin"], capture_output=True, text=True).stdout
    open(stem + ".sass", "w").write(sass)
    usage = subprocess.run([os.path.join(bindir, "cuobjdump"), "-res-usage", stem + ".cubin"], capture_output=True, text=True).stdout
    r = dict(ok=True, shared=k.metadata.shared)
    for line in usage.splitlines():
        if "REG:" in line:
            parts = dict(p.split(":") for p in line.split() if ":" in p)
            r["regs"], r["stack"] = int(parts.get("REG", -1)), int(parts.get("STACK", -1))
    res[os.path.basename(stem)] = r
json.dump(res, open(os.path.join(out_dir, "compiled.json"), "w"), indent=1)
'''


def cases():
    """[(tag, T, cache dtype, scale layout or None, DecodeConfig fields)]."""
    return [(f"T{T}_{name}", T, kvd, lay, {"whole_blocks": True, **cfg}) for T in (1, 8)
            for name, kvd, lay, cfg in BASE + EXTRA + MASKED]


def dump(out_dir: str) -> dict:
    """Lower every case; write OUT_DIR/<tag>.ttir and .json (its launch); return {tag: plan fields}."""
    from benchmarks.decode.kv_dtype_sass_cpu import lower_decode
    from benchmarks.decode.ttir_cpu import triton_modules
    from attnlab.kernels import decode as kd

    plans = {}
    with triton_modules() as captured:
        for tag, T, kvd, lay, cfg in cases():
            plan = kd.make_plan(B, T, S, N, K, H, "bfloat16", kd.DecodeConfig(kernel="triton", **cfg), sms=132,
                                compute_capability=(9, 0), kv_dtype=kvd if lay else None)
            lower_decode(out_dir, tag, plan, captured, T, kvd, lay)
            plans[tag] = dict(block_r=plan.block_r, block_k=plan.block_k, num_warps=plan.num_warps,
                              num_stages=plan.num_stages, splits=plan.num_splits, kv_mma=plan.kv_mma, config=cfg)
    return plans


def ttgir_counts(text: str) -> dict:
    """Layout traffic in the TTGIR: convert_layouts, shared-memory allocations / loads / stores, async copies."""
    ops = ("ttg.convert_layout", "ttg.local_alloc", "ttg.local_load", "ttg.local_store", "ttg.async_copy_global_to_local",
           "tt.fp_to_fp", "tt.bitcast", "tt.dot")
    return {op.split(".", 1)[1]: len(re.findall(re.escape(op) + r"\b", text)) for op in ops}


def ptx_counts(text: str) -> dict:
    """Static counts in the PTX: 8-bit conversions, global-load and cp.async widths, shared loads, barriers."""
    c = collections.Counter()
    for line in text.splitlines():
        t = line.strip()
        if t.startswith("cvt.") and ("e4m3" in t or "e5m2" in t or "bf16" in t):
            c["cvt." + t.split()[0].split(".", 1)[1]] += 1
        elif re.match(r"(@%p\d+\s+)?ld\.global", t):
            c[re.search(r"ld\.global\S*", t).group(0)] += 1
        elif "cp.async.c" in t and "shared.global" in t:
            width = re.search(r"\],\s*(0x[0-9a-f]+|\d+)", t.split("],", 1)[1])
            kind = re.search(r"cp\.async\.c[ag]", t).group(0)
            c[f"{kind} {int(width.group(1), 0) if width else '?'}B"] += 1
        elif re.match(r"(@%p\d+\s+)?ld\.shared", t):
            c[re.search(r"ld\.shared\S*", t).group(0)] += 1
        elif t.startswith("ldmatrix"):
            c[t.split()[0]] += 1
        elif t.startswith("bar.sync") or t.startswith("barrier.sync"):
            c["bar.sync"] += 1
        elif t.startswith("prmt"):
            c["prmt"] += 1
    return dict(c)


def main(argv=None) -> int:
    from benchmarks.decode.kv_dtype_sass_cpu import compile_cli, loop_ops, loops

    a, plans = compile_cli(__doc__.splitlines()[0], dump, argv, script=COMPILE)
    compiled = json.load(open(os.path.join(a.out_dir, "compiled.json")))
    rows = {}
    for tag, p in plans.items():
        r = dict(p, **compiled.get(tag, {}))
        if r.get("ok"):
            read = lambda ext: open(os.path.join(a.out_dir, f"{tag}.{ext}")).read()  # noqa: E731
            r.update(ttgir=ttgir_counts(read("ttgir")), ptx=ptx_counts(read("ptx")))
            ops = loop_ops(read("sass"))
            r["loop"] = dict(total=sum(ops.values()), **dict(ops.most_common()))
            ins, spans = loops(read("sass"))
            r["loops"] = sorted((sum(lo <= a <= hi for a, _ in ins) for lo, hi in spans), reverse=True)
        rows[tag] = r
    with open(os.path.join(a.out_dir, "counts.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    table = markdown(rows)
    with open(os.path.join(a.out_dir, "table.md"), "w") as fh:
        fh.write(table)
    print(table)
    return 0 if all(r.get("ok") and not r.get("stack") for r in rows.values()) else 1


def markdown(rows: dict) -> str:
    """One line per kernel: resources, the TTGIR's layout traffic, the PTX's static counts, the SASS loop."""
    cols = ["kernel", "shared KB", "regs", "spills", "convert_layout", "local_alloc / local_load", "cvt 8-bit",
            "cp.async (16B/8B/4B)", "ld.shared.b8", "ldmatrix", "bar.sync", "loop instr / warp / block", "loops",
            "loop LDS / LDSM / IMAD / F2FP / PRMT / FMUL"]
    out = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for tag, r in rows.items():
        if not r.get("ok"):
            out.append(f"| {tag} | FAILED |" + " |" * (len(cols) - 2))
            continue
        t, x, lp = r["ttgir"], r["ptx"], r["loop"]
        cp = "/".join(str(sum(v for k, v in x.items() if k.startswith("cp.async") and k.endswith(f" {n}B")))
                      for n in (16, 8, 4))
        cvt = sum(v for k, v in x.items() if k.startswith("cvt.") and ("e4m3" in k or "e5m2" in k))
        ldsm = sum(v for k, v in x.items() if k.startswith("ldmatrix"))
        loop = " / ".join(str(lp.get(o, 0)) for o in ("LDS", "LDSM", "IMAD", "F2FP", "PRMT", "FMUL"))
        out.append(f"| {tag} | {r['shared'] / 1024:.0f} | {r['regs']} | {r['stack']} | {t['convert_layout']} | "
                   f"{t['local_alloc']} / {t['local_load']} | {cvt} | {cp} | {x.get('ld.shared.b8', 0)} | {ldsm} | "
                   f"{x.get('bar.sync', 0)} | {lp['total']} | {' / '.join(map(str, r['loops']))} | {loop} |")
    return "\n".join(out) + "\n"

if __name__ == "__main__":
    sys.exit(main())
