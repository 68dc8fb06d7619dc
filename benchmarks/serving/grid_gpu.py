"""serving_attention over the issue's serving grid on the H200, in parts that resume (cells: ``grid_cells.py``).

    PYTHONPATH=src python benchmarks/serving/grid_gpu.py --out OUT --part N/M [--max-seconds 480]
        [--previous OLD.jsonl ...] [--redo-errors] [--no-peers]
    PYTHONPATH=src python benchmarks/serving/grid_gpu.py --table DIR [--merge A.jsonl B.jsonl ...]
    PYTHONPATH=src JAX_PLATFORMS=cpu python benchmarks/serving/grid_gpu.py --out OUT --dry-run

Each cell: its lengths drawn with a fixed seed and passed *traced* to ``jax.jit`` (``lengths_traced``); the plan
made by its own jitted function from them (``plan_ms``, set against a 32-layer step) and passed to the call;
the last <= 8 tokens of the longest and shortest request checked against float64 (``checks.py``) before any
path is timed (CUPTI, ``batches.time_ms``); % of the roofline of the valid work (``core.serving_cost``) and
tokens/s. Peers on the same batch: cuDNN on the padded decode batch (contiguous) or cuDNN's paged attention
(paged), JAX's Pallas paged decode kernel (paged, T = 1, on its own page layout made beforehand), the masked
xla path where its gathered K/V fit, and ``decode_attention``'s kernel on uniform batches (today's path).
Skipped: cells whose caches do not fit the device's memory (``needed_bytes``; the record says so).

Resume: cells already in OUT/results.jsonl or a ``--previous`` file are skipped (their records copied into
OUT/results.jsonl, so it is whole); a cell is written when done, so a killed call loses only the cell it was in.
``--max-seconds``: no cell starts whose estimated time would pass it. ``--table``: rewrites DIR/README.md (and
DIR/results.jsonl, one record per cell) from DIR/results.jsonl and the ``--merge`` files.
``--dry-run``: lists every cell with its bytes, estimate and part (OUT/cells.txt) and runs a few tiny cells end
to end on the CPU (Pallas interpret mode; host wall clock, not CUPTI).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from benchmarks.serving import batches as g  # noqa: E402
from benchmarks.serving import grid_cells as gc  # noqa: E402
from benchmarks.results_folder import roofline_peaks  # noqa: E402
from benchmarks.serving.grid_table import verdicts, write_table  # noqa: E402

XLA_GATHER_LIMIT = 24e9          # as gpu.py: the masked path's float32 gather of K and V per token
DRY_CELLS = (gc.Cell("dry", "uniform", 3, 256, 64, 4, 1, "contig"), gc.Cell("dry", "one-long", 3, 256, 64, 1, 2, "paged16"),
             gc.Cell("dry", "spread", 3, 256, 64, 4, 1, "paged16"), gc.Cell("dry", "lognormal", 3, 256, 256, 12, 8, "paged64"),
             gc.Cell("dry", "mixed 1x32+3", 4, 256, 64, 4, 1, "contig", (1, 32, 3)))


def memory_limit() -> float:
    """Bytes JAX may hold on the device (its ``bytes_limit``); on the CPU 90% of an H200's 139 GiB."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return float(stats.get("bytes_limit", 0.9 * 139 * 2**30))


class Caches:
    """The caches of the current (B, S, H, layout), drawn once and freed before the next ones are drawn."""

    def __init__(self):
        self.key, self.held, self.pallas = None, None, None

    def get(self, c):
        import jax
        import jax.numpy as jnp

        key = (c.B, c.S, c.H, c.layout)
        if key != self.key:
            self.key, self.held, self.pallas = None, None, None
            shape = (c.B, c.S, gc.K, c.H) if c.page is None else (c.B * c.S // c.page, c.page, gc.K, c.H)
            draw = g.jitted(("grid-draw", shape), lambda: jax.jit(lambda k: jax.random.normal(k, shape, jnp.bfloat16)))
            k, v = (jax.block_until_ready(draw(jax.random.PRNGKey(i))) for i in (1, 2))
            table = None
            if c.page is not None:   # pages in a shuffled order, as a server's allocator leaves them
                perm = np.random.default_rng(0).permutation(c.B * c.S // c.page).astype(np.int32)
                table = jnp.asarray(perm.reshape(c.B, c.S // c.page))
            self.key, self.held = key, (k, v, table)
        return self.held

    def pallas_pages(self):
        """(K, P, page, H) copies of the pages: JAX's Pallas paged kernel's layout (made once per cache)."""
        import jax.numpy as jnp

        if self.pallas is None:
            k, v, _ = self.held
            self.pallas = tuple(jnp.transpose(x, (2, 0, 1, 3)) for x in (k, v))
        return self.pallas


def wall_ms(fn, args, repeats=2):
    import jax

    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append((time.perf_counter() - t) * 1e3)
    return float(np.median(ts))


def peer_paths(c, caches, args, limit, no_peers):
    """({path: (fn, args)}, {path: why absent}) of the cell's peers (``grid_cells.paths_of``)."""
    import jax

    import attnlab
    from attnlab import backends

    q, k, v, a, b, t = args
    B, T, N, H = c.B, c.T, c.N, c.H
    paths, absent = {}, {}
    if no_peers:
        return paths, {"all": "--no-peers"}

    def dec(impl):
        return lambda q, k, v, a, b, t: attnlab.decode_attention(q.reshape(B, T, N, H), k, v, b, page_table=t,
                                                                 implementation=impl).reshape(B * T, N, H)
    static = (B, c.S, H, c.G, T, c.layout)
    for name in gc.paths_of(c)[1:]:
        impl = "pallas-paged" if name == "pallas-paged" else name.split()[0]
        why = backends.get(impl).available()
        if why:
            absent[name] = why
        elif name == "pallas-paged":
            from attnlab.backends.pallas_paged import launch_params, paged_call

            splits, per_block = launch_params(c.S, c.page, pages_per_block=max(1, 128 // c.page))
            fn = g.jitted(("grid-pallas", *static), lambda: jax.jit(lambda q, kp, vp, t, b: paged_call(
                q.reshape(B, 1, N, H), kp, vp, t, b, scale=1 / math.sqrt(H), k_splits=splits,
                pages_per_block=per_block).reshape(B, N, H)))
            paths[name] = (fn, (q, *caches.pallas_pages(), t, b))
        else:
            paths[name] = (g.jitted(("grid-" + name, *static), lambda: jax.jit(dec(impl))), args)
    if c.chunks is not None:
        absent["cudnn"] = "a mixed batch's requests differ in q_len: no padded decode batch"
    xb = gc.xla_bytes(c)
    if xb <= XLA_GATHER_LIMIT and xb + gc.needed_bytes(c) <= limit:
        paths["xla (masked)"] = (g.jitted(("grid-xla", *static, c.chunks), lambda: jax.jit(
            lambda q, k, v, a, b, t: attnlab.serving_attention(q, k, v, a, b, page_table=t, implementation="xla"))),
            args)
    else:
        absent["xla (masked)"] = "its float32 gather of K and V per token does not fit (over 24 GB or the memory left)"
    return paths, absent


def measure(fn, args, refs, roof_ms, tokens, dry) -> dict:
    """Check against float64, then time (CUPTI; on a dry run the host wall clock): a failure is a result."""
    r = {}
    try:
        r["check"] = g.check(fn(*args), refs)
        if not all(x["ok"] for x in r["check"]):
            return dict(r, error="check failed")
        r["ms"] = wall_ms(fn, args) if dry else g.time_ms(fn, args)
        r.update(pct_roofline=100 * roof_ms / r["ms"], tokens_per_s=tokens / (r["ms"] * 1e-3))
    except Exception as e:  # noqa: BLE001 - a path that fails is a result
        r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return r


def run_cell(c, caches, dev, limit, dry=False, no_peers=False) -> dict:
    """One cell's record (``grid_table`` module docstring)."""
    import jax
    import jax.numpy as jnp

    import attnlab
    from attnlab.core.serving_cost import serving_flops, serving_roofline_s
    from attnlab.kernels.serving_plan import ServingConfig

    t0 = time.perf_counter()
    q_len, kv = c.lengths()
    starts = g.starts_of(q_len)
    Ttot = int(starts[-1]) + (gc.MIXED_PAD if c.chunks else 0)
    roof = gc.roofline_ms(c)
    rec = dict(c.fields(), device=dev, lengths_traced=True, tokens=int(starts[-1]), kv_tokens=int(kv.sum()),
               kv_len_min=int(kv.min()), kv_len_median=int(np.median(kv)), kv_len_max=int(kv.max()),
               lengths_seed=3 if c.chunks else 7, roofline_ms=roof, timer="wall (interpret)" if dry else "cupti")
    k, v, table = caches.get(c)
    q = jax.random.normal(jax.random.PRNGKey(c.T), (Ttot, c.N, c.H), jnp.bfloat16)
    a, b = jnp.asarray(starts), jnp.asarray(kv)
    refs = g.references(q, k, v, starts, kv, table)
    max_q = int(q_len.max())
    cfg = ServingConfig(max_q_len=max_q if max_q <= 16 else None, decode_q_len=min(int(q_len.min()), 16))
    static = (Ttot, c.B, c.S, c.N, gc.K, c.H, c.layout, c.chunks)
    make_plan = g.jitted(("grid-plan", cfg, *static), lambda: jax.jit(lambda a, b: attnlab.serving_plan(
        a, b, total_tokens=Ttot, kv_len_max=c.S, heads=c.N, kv_heads=gc.K, head_dim=c.H, config=cfg)))
    plan = make_plan(a, b)
    serve = g.jitted(("grid-serving", *static), lambda: jax.jit(
        lambda q, k, v, a, b, t, p: attnlab.serving_attention(q, k, v, *p.lengths, page_table=t, plan=p,
                                                             implementation="attnlab-decode")))
    own = measure(serve, (q, k, v, a, b, table, plan), refs, roof, int(starts[-1]), dry)
    rec.update(own, status="error" if "error" in own else "ok")
    if "ms" in own:
        rec["plan_ms"] = wall_ms(make_plan, (a, b)) if dry else g.time_ms(make_plan, (a, b))
        if not dry:
            try:
                rec["kernels"] = g.kernels_ms(serve, (q, k, v, a, b, table, plan))
            except Exception as e:  # noqa: BLE001 - the breakdown is extra
                rec["kernels_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        if c.chunks:    # the two tile classes run in sequence: their rooflines' sum bounds the step
            cls = [serving_roofline_s(g.starts_of(q_len[s]), kv[s], c.N, gc.K, c.H, 2, **roofline_peaks()) * 1e3 if s.any() else 0.0
                   for s in (q_len <= 16, q_len > 16)]
            rec.update(class_roofline_ms=cls, sequential_bound_pct=100 * roof / sum(cls))
            pk = [t for n, t in rec.get("kernels", []) if "serving_prefill_r" in n]
            if pk:
                s = q_len > 16
                rec["prefill_tflops"] = serving_flops(g.starts_of(q_len[s]), kv[s], c.N, c.H) / (pk[0] * 1e-3) / 1e12
    paths, rec["peers_absent"] = peer_paths(c, caches, (q, k, v, a, b, table), limit, no_peers)
    rec["peers"] = {n: measure(fn, args, refs, roof, int(starts[-1]), dry) for n, (fn, args) in paths.items()}
    rec.update(verdicts(rec), seconds=round(time.perf_counter() - t0, 2))
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--part", help="N/M: the Nth of M parts of about equal estimated time (default: all)")
    ap.add_argument("--max-seconds", type=float, default=480.0)
    ap.add_argument("--previous", nargs="*", default=[], help="earlier results.jsonl: their cells are skipped")
    ap.add_argument("--redo-errors", action="store_true", help="run again the cells recorded with an error")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="list the cells; run a few tiny ones on the CPU")
    ap.add_argument("--table", metavar="DIR", help="rewrite DIR/README.md from DIR/results.jsonl (+ --merge)")
    ap.add_argument("--merge", nargs="*", default=[], help="with --table: results.jsonl files to merge in")
    a = ap.parse_args(argv)
    if a.table:
        print(write_table(a.table, a.merge))
        return
    if not a.out:
        ap.error("--out is required (or --table DIR)")
    n, m = gc.parse_part(a.part)
    import jax

    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "results.jsonl")
    t0, dev, limit = time.perf_counter(), str(jax.devices()[0].device_kind), memory_limit()
    if a.dry_run:
        print("\n".join(gc.list_cells(os.path.join(a.out, "cells.txt"), 3)))
        todo = list(DRY_CELLS)
    else:
        todo = gc.part_of(gc.cells(), n, m)
    have = gc.read_records([path])
    ids = {r.get("cell_id") for r in have}
    carried = [r for r in gc.read_records(a.previous) if r.get("cell_id") not in ids]
    caches, est = Caches(), dict(zip((c.cell_id for c in todo), gc.estimate_s(todo)))
    left, ran = gc.cells_left(todo, have + carried, a.redo_errors), 0
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in carried)
        for i, c in enumerate(left):
            if not a.dry_run and time.perf_counter() - t0 + est[c.cell_id] > a.max_seconds:
                print(f"stopped at --max-seconds {a.max_seconds:.0f}: {len(left) - i} cells of part {n}/{m} left; "
                      "run the same command again with --previous this results.jsonl", flush=True)
                break
            need = gc.needed_bytes(c)
            if need > limit:
                rec = dict(c.fields(), device=dev, status="skipped", reason=f"needs ~{need / 1e9:.0f} GB of device "
                           f"memory (caches {gc.cache_bytes(c) / 1e9:.0f} GB), {limit / 1e9:.0f} GB available")
            else:
                try:
                    rec = run_cell(c, caches, dev, limit, a.dry_run, a.no_peers)
                except Exception as e:  # noqa: BLE001 - a cell that fails (out of memory...) is a result
                    caches.__init__()
                    rec = dict(c.fields(), device=dev, status="error", error=f"{type(e).__name__}: {str(e)[:300]}")
            print(f"{c.cell_id:<52} {rec.get('ms', 0):8.4f} ms {rec.get('pct_roofline', 0):5.1f}% "
                  f"{rec.get('goal', rec['status'])} | {rec.get('vs_peer', '')} {rec.get('reason', rec.get('error', ''))[:80]}",
                  flush=True)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            ran += 1
    cmd = "python benchmarks/serving/grid_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with open(os.path.join(a.out, "runs.txt"), "a", encoding="utf-8") as f:
        f.write(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} | jax {jax.__version__}, {dev} | "
                f"{'dry run' if a.dry_run else f'part {n}/{m}'} | "
                f"{time.perf_counter() - t0:.0f} s | {ran} cells | `{cmd}`\n")
    print(write_table(a.out))


if __name__ == "__main__":
    main()
