"""Issue 25's H200 evidence: attnlab-decode for every group size, paged caches, row tiles (one run, capped).

    PYTHONPATH=src python3 benchmarks/decode/grid.py OUT_DIR [part ...] [--max-seconds 300]   # measure (resumable)
    python3 benchmarks/decode/grid.py --table OUT_DIR                                         # markdown + goals

Parts (run in ``SCHEDULE``'s order, which stops starting cells once --max-seconds are spent; rerun to resume):
  grid   sweep engine, B=8, S=32768, H=128, bf16, causal, full lengths; G in {4, 7, 16, 8, 1} as
         (N, K) = (32, 8), (28, 4), (64, 4), (64, 8), (8, 8); T = 1..64; attnlab-decode and cudnn
  paged  the same shapes at T = 1, 4, 16 with paged caches (page size 16 and 64: ``--lengths
         paged16,paged64``; pages shuffled, made before timing, checked as the contiguous twin);
         attnlab-decode and cudnn (cuDNN's own paged attention)
  ragged the same shapes at T = 1, 4, 16 with ragged lengths (the split count follows them)
  tiles  the kernel called directly at T*G > 128 rows: the default plan (row tiles of 128) against
         one 256-row tile (8 warps, block_k 16/32); CUPTI time and error against a float32 reference
Every sweep cell's whole output is checked before CUPTI timing; records carry ``pct_roofline``
(max(KV bytes / 4.8 TB/s, FLOPs / 989 TFLOP/s) / time).
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

PAIRS = [(32, 8), (28, 4), (64, 4), (64, 8), (8, 8)]
T_ALL = [1, 2, 4, 8, 16, 32, 64]
T_PAGED = [1, 4, 16]
BACKENDS = ["attnlab-decode", "cudnn"]
TILE_SHAPES = [(64, 32, 8), (32, 64, 8), (16, 64, 4), (32, 28, 4)]          # (T, N, K): 224-256 rows
TILE_VARIANTS = [{}, {"block_r": 256, "block_k": 32, "num_warps": 8}, {"block_r": 256, "block_k": 16, "num_warps": 8}]


#: (B, S): the issue's grid; ``--smoke`` shrinks it to run the whole script on a CPU (interpret mode)
SIZE = {"B": 8, "S": 32768}


class _OutOfTime(Exception):
    pass


#: What runs first when --max-seconds cuts the run short: the goal's GQA and the odd group size, their
#: paged twins, the row-tile variants, then the other group sizes.
SCHEDULE = [("grid", (32, 8)), ("grid", (28, 4)), ("paged", (32, 8)), ("paged", (28, 4)), ("ragged", (32, 8)),
            ("tiles", None), ("grid", (64, 4)), ("grid", (64, 8)), ("grid", (8, 8)), ("paged", (64, 4)),
            ("ragged", (28, 4)), ("paged", (64, 8)), ("paged", (8, 8))]


def sweep_of(part: str, pair):
    from attnlab.sweep import Sweep

    common = dict(batch=[SIZE["B"]], kv_len=[SIZE["S"]], head_dim=[128], dtype=["bfloat16"], causal=[True])
    N, K = pair
    if part == "grid":
        return Sweep(BACKENDS, q_len=T_ALL, heads=[N], kv_heads=[K], lengths=["full"], name="grid", **common)
    if part == "ragged":
        return Sweep(BACKENDS, q_len=T_PAGED, heads=[N], kv_heads=[K], lengths=["ragged"], name="ragged", **common)
    return Sweep(BACKENDS, q_len=T_PAGED, heads=[N], kv_heads=[K], lengths=["paged16", "paged64"],
                 name="paged", **common)


def tiles(out: str, deadline: float) -> None:
    import jax
    import jax.numpy as jnp

    import attnlab
    from attnlab.backends.attnlab_decode import roofline_ms
    from attnlab.kernels import decode as kd
    from attnlab.measure import timers

    path = os.path.join(out, "tiles.jsonl")
    done = set()
    if os.path.exists(path):
        done = {json.dumps([r["T"], r["N"], r["K"], r["config"]]) for r in map(json.loads, open(path))}
    B, S, H = SIZE["B"], SIZE["S"], 128
    interpret = jax.default_backend() != "gpu"
    for T, N, K in TILE_SHAPES:
        q, k, v = attnlab.reference.inputs.random_qkv(B, T, S, N, K, H, "bfloat16", seed=T)
        n = jnp.full((B,), S, jnp.int32)
        f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
        with jax.default_matmul_precision("highest"):
            ref = jax.jit(lambda q, k, v, n: attnlab.decode_attention(f32(q), f32(k), f32(v), n,
                                                                       implementation="xla"))(q, k, v, n)
        for cfg in TILE_VARIANTS:
            if time.perf_counter() > deadline:
                raise _OutOfTime
            key = json.dumps([T, N, K, cfg])
            if key in done:
                continue
            rec = {"T": T, "N": N, "K": K, "B": B, "S": S, "H": H, "config": cfg}
            try:
                plan = kd.make_plan(B, T, S, N, K, H, "bfloat16", kd.DecodeConfig(**cfg), compute_capability=(9, 0))
                rec["plan"] = plan.__dict__
                fn = jax.jit(lambda q, k, v, n, plan=plan: kd.decode_attention_pallas(q, k, v, n, plan=plan,
                                                                                      interpret=interpret))
                out_ = fn(q, k, v, n)
                d = out_.astype(jnp.float32) - ref
                rec["rel_err"] = float(jnp.linalg.norm(d.ravel()) / jnp.linalg.norm(ref.ravel()))
                st = (timers.wall_per_call(fn, [(q, k, v, n)], 1) if interpret
                      else timers.kernel_per_call(fn, [(q, k, v, n)], 10))
                rec["ms"] = st.median
                rec["pct_roofline"] = 100 * roofline_ms([S] * B, T, N, K, H, 2) / st.median
            except Exception as e:  # noqa: BLE001 - a variant that fails is a result
                rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"[tiles] T{T} N{N}/{K} {json.dumps(cfg):<50} {rec.get('ms', 0):8.4f} ms "
                  f"{rec.get('pct_roofline', 0):5.1f}% roof err {rec.get('rel_err', 0):.1e} {rec.get('error', '')[:100]}",
                  flush=True)
            with open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")


def measure(out: str, names: list[str], max_seconds: float) -> None:
    from attnlab.measure import Options
    from attnlab.sweep import run_sweep

    t0 = time.perf_counter()
    deadline = t0 + max_seconds
    opts = Options(repeats=10, compile_budget_s=60)

    def show(c, r, i, n):
        if r:
            print(f"[{time.perf_counter() - t0:6.1f}s] {c.backend:<15} {c.config_label:<58} {r['status']:<12} "
                  f"{r['kernel_ms'] or 0:8.4f} ms {r['gbps'] or 0:7.0f} GB/s roof {r.get('pct_roofline') or 0:5.1f}% "
                  f"{(r['reason'] or '')[:90]}", flush=True)
        if time.perf_counter() > deadline:
            raise _OutOfTime

    os.makedirs(out, exist_ok=True)
    try:
        for part, pair in SCHEDULE:
            if names and part not in names:
                continue
            if time.perf_counter() > deadline:
                raise _OutOfTime
            if part == "tiles":
                tiles(out, deadline)
            else:
                run_sweep(sweep_of(part, pair), out, resume=True, options=opts, on_cell=show)
    except _OutOfTime:
        print(json.dumps({"stopped": f"--max-seconds {max_seconds:g} reached; rerun to resume"}), flush=True)
    print(json.dumps({"out": out, "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


# --- the table (no JAX) ---------------------------------------------------------------------------

def _load(path):
    out = []
    if os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue   # a torn last line
    return out


def goal_pct(T: int, G: int) -> int:
    """The issue's goal: >= 85% of the roofline bound where T*G <= 64, >= 70% elsewhere."""
    return 85 if T * G <= 64 else 70


def table(out: str) -> str:
    recs = [r for r in _load(os.path.join(out, "results.jsonl")) if r.get("lengths")]
    by = {}
    for r in recs:
        by[(r["backend"], r["heads"], r["kv_heads"], r["q_len"], r["lengths"], r.get("page_size"))] = r

    def cell(r):
        if r is None:
            return "", None
        if r["status"] != "ok":
            return f"✗ {r['status']}", None
        ms = r["kernel_ms"] if r.get("kernel_ms") is not None else r["wall_ms"]     # wall only off the GPU (†)
        mark = "" if r.get("timer") == "cupti" else "†"
        return f"{ms:.4f}{mark} · {(r.get('gbps') or 0) / 1e3:.2f} · {r.get('pct_roofline') or 0:.0f}%", ms

    lines = ["**grid** (B=8, S=32768, H=128, bf16, causal, full lengths): ms · TB/s · % of roofline; goal = "
             "85% of roofline where T·G ≤ 64, else 70%", "",
             "| G (N/K) | T | rows T·G | attnlab-decode | goal | cudnn | × cuDNN |", "|" + " --- |" * 7]
    missed = []
    for N, K in PAIRS:
        G = N // K
        for T in T_ALL:
            own, cud = by.get(("attnlab-decode", N, K, T, "full", None)), by.get(("cudnn", N, K, T, "full", None))
            if own is None and cud is None:
                continue
            o, oms = cell(own)
            c, cms = cell(cud)
            goal = goal_pct(T, G)
            if oms is not None:
                pct = own.get("pct_roofline") or 0
                verdict = f"met ({goal}%)" if pct >= goal else f"**missed by {goal - pct:.0f} pts** ({goal}%)"
                if pct < goal:
                    missed.append(f"G={G} T={T}: {pct:.0f}% < {goal}%")
            else:
                verdict = "–"
            ratio = f"{cms / oms:.2f}" if oms and cms else "–"
            lines.append(f"| {G} ({N}/{K}) | {T} | {T * G} | {o} | {verdict} | {c} | {ratio} |")
    lines += ["", "**paged** (same shapes, full lengths in shuffled pages): ms; paged / contiguous (goal ≤ 1.05)", "",
              "| G (N/K) | T | contiguous | paged 16 | ratio | paged 64 | ratio | cudnn | cudnn paged 16 | cudnn paged 64 |",
              "|" + " --- |" * 10]
    for N, K in PAIRS:
        for T in T_PAGED:
            base = by.get(("attnlab-decode", N, K, T, "full", None))
            row = [f"{N // K} ({N}/{K})", str(T), cell(base)[0]]
            bms = cell(base)[1]
            for ps in (16, 64):
                txt, ms = cell(by.get(("attnlab-decode", N, K, T, "paged", ps)))
                row += [txt.split(" · ")[0], f"{ms / bms:.3f}" if ms and bms else "–"]
            row.append(cell(by.get(("cudnn", N, K, T, "full", None)))[0].split(" · ")[0])
            for ps in (16, 64):
                r = by.get(("cudnn", N, K, T, "paged", ps))
                row.append(cell(r)[0].split(" · ")[0] if r and r["status"] == "ok"
                           else (f"✗ {(r.get('reason') or r['status'])[:60]}" if r else ""))
            if any(by.get((b, N, K, T, "paged", ps)) for b in BACKENDS for ps in (16, 64)):
                lines.append("| " + " | ".join(row) + " |")
    lines += ["", "**ragged** (same shapes, ragged lengths): ms · TB/s · % of roofline; T = 1 goal: within 5% of cuDNN",
              "", "| G (N/K) | T | attnlab-decode | cudnn | attnlab / cuDNN |", "|" + " --- |" * 5]
    for N, K in PAIRS:
        for T in T_PAGED:
            o, oms = cell(by.get(("attnlab-decode", N, K, T, "ragged", None)))
            c, cms = cell(by.get(("cudnn", N, K, T, "ragged", None)))
            if o or c:
                lines.append(f"| {N // K} ({N}/{K}) | {T} | {o} | {c} | {f'{oms / cms:.3f}' if oms and cms else '–'} |")
    tl = _load(os.path.join(out, "tiles.jsonl"))
    if tl:
        lines += ["", "**tiles** (kernel alone, B=8, S=32768, H=128, full): CUPTI ms, % roofline, rel err vs float32", "",
                  "| T | N/K | rows | config | plan (block_r × row tiles, block_k, warps, stages, splits) | ms | % roof | err |",
                  "|" + " --- |" * 8]
        for r in tl:
            p = r.get("plan") or {}
            plan = (f"{p.get('block_r')}×{p.get('row_tiles')}, {p.get('block_k')}, {p.get('num_warps')}, "
                    f"{p.get('num_stages')}, {p.get('num_splits')}") if p else "–"
            res = (f"{r['ms']:.4f} | {r['pct_roofline']:.0f}% | {r['rel_err']:.1e}" if "ms" in r
                   else f"✗ {r.get('error', '')[:80]} | | ")
            lines.append(f"| {r['T']} | {r['N']}/{r['K']} | {r['T'] * r['N'] // r['K']} | {json.dumps(r['config']) or 'default'} "
                         f"| {plan} | {res} |")
    lines += ["", "**goals missed**: " + ("; ".join(missed) if missed else "none on the cells measured")]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # the repository root
    from benchmarks.results_folder import script_args  # noqa: E402 (after sys.path)

    args = script_args(__doc__, options=("--table", "--max-seconds", "--smoke"))
    if args[0] == "--table":
        print(table(args[1]))
    else:
        max_s = float(args[args.index("--max-seconds") + 1]) if "--max-seconds" in args else 300.0
        rest = [a for i, a in enumerate(args) if a != "--max-seconds" and (i == 0 or args[i - 1] != "--max-seconds")]
        if "--smoke" in rest:
            rest.remove("--smoke")
            SIZE.update(B=2, S=256)
            TILE_SHAPES[:] = TILE_SHAPES[-1:]
        if not rest:                        # only options: no OUT_DIR to measure into
            print(__doc__, file=sys.stderr)
            sys.exit(2)
        measure(rest[0], rest[1:], max_s)
