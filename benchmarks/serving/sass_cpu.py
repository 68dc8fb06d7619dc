"""On a CPU: the serving kernel's sm_90 instructions against the decode kernel's, and a step's issue time.

    PYTHONPATH=src python3 benchmarks/serving/sass_cpu.py OUT_DIR --triton-python /path/to/venv/bin/python

For the decode-class rows the H200 measured (results/gpu-2026-12-05-serving-grid: G=4/7, T=1/4;
results/gpu-2026-12-05c-serving-wide-rows: G=12/16, T=8, 64/128-row tiles, block_k 64/32; B=32, S<=32768, K=8,
H=128, bf16, contiguous) lowers ``kernels.serving`` (its piece kernel and its merge) and ``kernels.decode``
(Triton, the same block_r and block_k) under an abstract H200, compiles each for sm_90 with pip's triton 3.6.0
and disassembles it (``benchmarks/decode/kv_dtype_sass_cpu.py``'s ``SASS``). Counts per warp: the KV loop (the
largest innermost loop: one block of block_k keys), a piece's cost outside it (the piece loop's other
instructions: its q gather, the pipeline's prologue and drain, the partial's store) and the merge's loop (one
piece) and once-per-program code. With the plan ``make_serving_plan`` makes for the batch's concrete lengths
(``core.request_lengths.draw``, seed 7, as the H200 runs) it sums every program's work:
``issue_ms`` = sum over programs of (blocks x loop + pieces x piece cost) x warps, and the merge's units x
(pieces x merge loop + once) x warps, over (4 per clock x 1.98 GHz x 132 SMs); beside the valid bytes' time at
4.8 TB/s and the H200's measured kernel times. A strong hint, not a proof: XLA compiles the same IR with
jaxlib's Triton.
"""
from __future__ import annotations

import collections
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, ROOT)
from benchmarks.decode.kv_dtype_sass_cpu import compile_cli, loops  # noqa: E402  (after the path)

B, S, K, H, HZ, SMS = 32, 32768, 8, 128, 1.98e9, 132
#: (G, T, block_k or None, block_r_decode or None, the H200 results folder)
CASES = ((4, 1, None, None, "grid"), (4, 4, None, None, "grid"), (7, 1, None, None, "grid"),
         (7, 4, None, None, "grid"), (12, 8, None, None, "wide"), (12, 8, None, 64, "wide"), (12, 8, 32, None, "wide"),
         (16, 8, None, None, "wide"), (16, 8, None, 64, "wide"), (16, 8, 32, None, "wide"))
DISTS = {"grid": ("uniform", "spread", "lognormal", "one-long"), "wide": ("uniform", "lognormal", "one-long")}
RESULTS = {"grid": "results/gpu-2026-12-05-serving-grid/results.jsonl",
           "wide": "results/gpu-2026-12-05c-serving-wide-rows/results.jsonl"}


def tag_of(G, T, bk, br) -> str:
    return f"G{G}_T{T}" + (f"_k{bk}" if bk else "") + (f"_r{br}" if br else "")


def config(T, bk, br):
    from attnlab.kernels.serving_plan import ServingConfig
    return ServingConfig(max_q_len=T, decode_q_len=T, block_k=bk, block_r_decode=br)


def dump(out_dir: str) -> dict:
    """Lower each case's serving call (piece kernel, merge) and decode kernel; write <tag>_{serving,merge,decode}
    .ttir/.json (their launch); return {tag: the serving class's static plan fields and the decode plan's}."""
    import jax
    import jax.numpy as jnp

    from attnlab.kernels import decode as kd
    from attnlab.kernels import serving as ks
    from attnlab.kernels.serving_plan import make_serving_plan
    from benchmarks.decode.ttir_cpu import triton_modules

    s, meta = jax.ShapeDtypeStruct, {}

    def keep(name, ttir, warps, stages):
        with open(os.path.join(out_dir, name + ".ttir"), "w") as fh:
            fh.write(ttir)
        with open(os.path.join(out_dir, name + ".json"), "w") as fh:
            json.dump(dict(num_warps=warps, num_stages=stages), fh)

    with triton_modules() as captured:
        for G, T, bk, br, _ in CASES:
            tag, N, cfg = tag_of(G, T, bk, br), G * K, config(T, bk, br)
            mk = dict(total_tokens=B * T, kv_len_max=S, heads=N, kv_heads=K, head_dim=H, config=cfg, sms=132)
            kv = s((B, S, K, H), jnp.bfloat16)
            args = [s((B * T, N, H), jnp.bfloat16), kv, kv, s((B + 1,), jnp.int32), s((B,), jnp.int32)]

            def f(q, k, v, a, b):
                return ks.serving_attention_pallas(q, k, v, a, b, plan=make_serving_plan(a, b, **mk), interpret=False)

            n0 = len(captured)
            with kd.cuda_lowering_context():
                jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
            cp = jax.eval_shape(lambda a, b: make_serving_plan(a, b, **mk), args[3], args[4]).classes[0]
            merge_warps = 8 if cp.block_r * H > 8192 else 4
            # pieces the merge loads a trip (1 before ``merge_pieces_per_trip``)
            per_trip = getattr(ks, "merge_pieces_per_trip", lambda r, h: 1)(cp.block_r, H)
            keep(tag + "_serving", captured[n0], cp.num_warps, kd.compiled_stages(cp.num_stages, 0))
            keep(tag + "_merge", captured[n0 + 1], merge_warps, 1)
            dp = kd.make_plan(B, T, S, N, K, H, "bfloat16", kd.DecodeConfig(block_k=cp.block_k, block_r=cp.block_r,
                                                                             kernel="triton"),
                              sms=132, compute_capability=(9, 0))
            with kd.cuda_lowering_context():
                jax.jit(lambda q, k, v, n: kd.decode_attention_pallas(q, k, v, n, causal=True, interpret=False, plan=dp)
                        ).trace(s((B, T, N, H), jnp.bfloat16), kv, kv, s((B,), jnp.int32)).lower(
                    lowering_platforms=("cuda",))
            keep(tag + "_decode", captured[-1], dp.num_warps, dp.num_stages)
            meta[tag] = dict(G=G, T=T, block_r=cp.block_r, block_k=cp.block_k, warps=cp.num_warps,
                             stages=cp.num_stages, programs=cp.programs, merge_warps=merge_warps, per_trip=per_trip,
                             decode_plan=dict(block_r=dp.block_r, block_k=dp.block_k, row_tiles=dp.row_tiles,
                                              warps=dp.num_warps, stages=dp.num_stages))
    return meta


def counts(sass: str) -> dict:
    """Per warp: ``loop`` (the largest innermost loop's opcodes), ``outer`` (the rest of the loop around it,
    once per trip of that loop: a piece), ``once`` (everything outside both); and the loop's opcodes."""
    ins, spans = loops(sass)
    inner = [sp for sp in spans if not any(o != sp and sp[0] <= o[0] and o[1] <= sp[1] for o in spans)]
    lo, hi = max(inner, key=lambda x: x[1] - x[0])
    around = [sp for sp in spans if sp[0] <= lo and hi <= sp[1] and sp != (lo, hi)]
    olo, ohi = min(around, key=lambda x: x[1] - x[0]) if around else (lo, hi)
    ops = collections.Counter(op for a, op in ins if lo <= a <= hi)
    n_outer = sum(olo <= a <= ohi for a, _ in ins)
    n_total = sum(op not in ("NOP",) for _, op in ins)
    return dict(loop=sum(ops.values()), outer=n_outer - sum(ops.values()), once=n_total - n_outer,
                opcodes=dict(ops.most_common()))


def measured(kind: str, dist: str, G: int, T: int, bk, br) -> dict:
    """The H200 record of this batch and tile: {ms, roofline_ms, kernel ms, merge ms}, or {}."""
    with open(os.path.join(ROOT, RESULTS[kind])) as fh:
        for line in fh:
            r = json.loads(line)
            if kind == "grid":
                ok = r.get("cell_id") == f"{dist}|B32|S32768|H128|G{G}|T{T}|contig"
            else:
                ok = (r.get("batch") == f"decode variant {dist}" and r["G"] == G and r["T"] == T
                      and r.get("block_k") == bk and r.get("block_r_decode") == br)
            if ok and r.get("ms"):
                kern = dict(r["kernels"])
                return dict(ms=r["ms"], roofline_ms=r["ms"] * r["pct_roofline"] / 100,
                            kernel_ms=sum(v for n, v in kern.items() if "serving" in n and "merge" not in n),
                            merge_ms=sum(v for n, v in kern.items() if "merge" in n))
    return {}


def plan_work(G, T, bk, br, dist) -> dict:
    """The plan's real work on this batch: per program blocks and pieces (every KV head the same), units' pieces."""
    from attnlab.core.request_lengths import draw
    from attnlab.kernels.serving_plan import FIELDS, make_serving_plan

    kv = draw(dist, B, T, S, np.random.default_rng(7))
    starts = np.arange(B + 1, dtype=np.int32) * T
    cp = make_serving_plan(starts, kv, total_tokens=B * T, kv_len_max=S, heads=G * K, kv_heads=K, head_dim=H,
                           config=config(T, bk, br), sms=132).classes[0]
    blocks = np.asarray(cp.pieces)[:, FIELDS.index("blocks")]
    st = np.asarray(cp.starts)
    per_prog = [(int(blocks[a:b].sum()), int((blocks[a:b] > 0).sum())) for a, b in zip(st[:-1], st[1:])]
    units = np.asarray(cp.units)
    per_unit = units[:, 4] - units[:, 3]
    valid_blocks = int(np.sum(-(-kv // cp.block_k)))
    return dict(kv_tokens=int(kv.sum()), per_prog=per_prog, unit_pieces=[int(x) for x in per_unit if x > 0],
                units=int(units.shape[0]), valid_blocks=valid_blocks, block_k=cp.block_k, block_r=cp.block_r)


def main(argv=None) -> int:
    a, meta = compile_cli(__doc__.splitlines()[0], dump, argv)
    rate = 4 * HZ * SMS / 1e3          # instructions per ms over the GPU
    res, rows = {}, []
    print(f"{'case':<14} {'loop srv/dec':>12} {'piece':>5} {'merge loop/once':>15}")
    for tag, m in meta.items():
        c = {k: counts(open(os.path.join(a.out_dir, f"{tag}_{k}.sass")).read()) for k in ("serving", "merge", "decode")}
        m.update(counts=c)
        print(f"{tag:<14} {c['serving']['loop']:5d}/{c['decode']['loop']:<6d} {c['serving']['outer']:5d} "
              f"{c['merge']['loop']:7d}/{c['merge']['once']:<7d}  serving only: " + " ".join(
                  f"{op}{n - c['decode']['opcodes'].get(op, 0):+d}" for op, n in c["serving"]["opcodes"].items()
                  if n != c["decode"]["opcodes"].get(op, 0)))
        kind = next(k for g, t, bk, br, k in CASES if tag_of(g, t, bk, br) == tag)
        bk, br = (next((x[2], x[3]) for x in CASES if tag_of(*x[:4]) == tag))
        for dist in DISTS[kind]:
            w = plan_work(m["G"], m["T"], bk, br, dist)
            prog = [(nb * c["serving"]["loop"] + np_ * c["serving"]["outer"] + c["serving"]["once"]) * m["warps"]
                    for nb, np_ in w["per_prog"]]
            merge = sum((-(-p // m["per_trip"]) * c["merge"]["loop"] + c["merge"]["once"]) * m["merge_warps"]
                        for p in w["unit_pieces"])
            # the decode kernel on the same blocks (its row tiles each read them): the loops alone
            dec = w["valid_blocks"] * m["decode_plan"]["row_tiles"] * m["decode_plan"]["warps"] * c["decode"]["loop"]
            blocks = [nb for nb, _ in w["per_prog"]]
            pieces = [np_ for _, np_ in w["per_prog"]]
            row = dict(tag=tag, dist=dist, block_r=m["block_r"], block_k=m["block_k"], warps=m["warps"],
                       programs=m["programs"], loop=c["serving"]["loop"], decode_loop=c["decode"]["loop"],
                       piece=c["serving"]["outer"], blocks_max=max(blocks), blocks_min=min(blocks),
                       blocks_total=sum(blocks), valid_blocks=w["valid_blocks"], pieces_max=max(pieces),
                       pieces_total=sum(pieces), unit_pieces_max=max(w["unit_pieces"]),
                       issue_ms=K * sum(prog) / rate, issue_max_prog_ms=2 * max(prog) / (4 * HZ) * 1e3,
                       decode_issue_ms=K * dec / rate, merge_issue_ms=K * merge / rate,
                       bytes_ms=2 * w["kv_tokens"] * K * H * 2 / 4.8e9, **measured(kind, dist, m["G"], m["T"], bk, br))
            rows.append(row)
    fits = fit_tiles(rows)
    res = dict(cases=meta, rows=rows, fits=fits)
    with open(os.path.join(a.out_dir, "sass.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print("\n| case | batch | tile | loop (decode kernel) | piece | blocks/program min-max (pieces max) | issue ms "
          "(decode kernel) | merge issue ms | bytes ms | measured kernel / merge ms | kernel / issue |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        meas = (f"{r['kernel_ms']:.4f} / {r['merge_ms']:.4f} | {r['kernel_ms'] / r['issue_ms']:.2f}"
                if r.get("kernel_ms") else "not run | ")
        print(f"| {r['tag']} | {r['dist']} | {r['block_r']}x{r['block_k']} w{r['warps']} | {r['loop']} "
              f"({r['decode_loop']}) | {r['piece']} | {r['blocks_min']}-{r['blocks_max']} ({r['pieces_max']}) | "
              f"{r['issue_ms']:.4f} ({r['decode_issue_ms']:.4f}) | {r['merge_issue_ms']:.4f} | {r['bytes_ms']:.4f} | "
              f"{meas} |")
    print("\nmeasured kernel ms = blocks per program x a + pieces per program (the most) x b + c, per tile:")
    for tile, f in fits.items():
        print(f"  {tile}: a {f['us_per_block']:.3f} us per block, b {f['us_per_piece']:.2f} us per piece, "
              f"c {f['us_fixed']:.2f} us ({f['rows']} rows, worst residual {f['worst_residual_us']:.2f} us)")
    return 0


def fit_tiles(rows) -> dict:
    """Least squares, per tile (rows x block_k, warps), of the measured piece-kernel time on the critical
    program's blocks and pieces: what a block and a piece cost in time, beside what they cost to issue."""
    by = collections.defaultdict(list)
    for r in rows:
        if r.get("kernel_ms"):
            by[f"{r['block_r']}x{r['block_k']} w{r['warps']}"].append(r)
    fits = {}
    for tile, rs in by.items():
        x = np.array([[r["blocks_max"], r["pieces_max"], 1.0] for r in rs])
        y = np.array([r["kernel_ms"] * 1e3 for r in rs])
        coef = np.linalg.lstsq(x, y, rcond=None)[0]
        fits[tile] = dict(us_per_block=coef[0], us_per_piece=coef[1], us_fixed=coef[2], rows=len(rs),
                          worst_residual_us=float(np.abs(x @ coef - y).max()))
    return fits


if __name__ == "__main__":
    sys.exit(main())
