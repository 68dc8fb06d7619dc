"""Attention sinks in attnlab's decode and serving kernels on the GPU: each call with sinks against the same call without.

    PYTHONPATH=src python benchmarks/decode/sinks_gpu.py --out OUT [--max-seconds 100] [--repeats 20]

Goal (serving models need sinks: gpt-oss): sinks cost <= 3% over the same call without them. The kernels
add a sink once per query row after the splits (decode: the log-sum-exp combine; serving: the merge kernel),
so the KV loop is the same; what a sink costs is one more exp2 and a load per row there.

Cases (bf16, causal, lengths traced arguments of ``jax.jit``, the sinks a traced (N,) float32 argument):
decode_attention on attnlab-decode with gpt-oss-20b's attention (N/K = 64/8, H = 64) at B = 32, S = 8192,
T = 1, 4 (Triton kernel) and 16 (128 rows per KV head: the Mosaic GPU kernel on sm_90), contiguous and in
pages of 16, ragged; Llama-3.1-70B's (64/8, H = 128) at B = 8, S = 32768, T = 1, 4; serving_attention
(attnlab's serving kernel) on 64 ragged decodes and on a mixed batch (2 prefill chunks of 2048 + 126
decodes) with gpt-oss's heads. Each call is first checked against float64 (``benchmarks.serving.checks``:
the last <= 8 tokens of the longest and the shortest sequence, the decode tolerance policy; with sinks the
reference has them), then timed by CUPTI (``jax.experimental.mosaic.gpu.profiler.measure``: every kernel of
a call summed, the combine included), plain and with sinks in alternation over ``ROUNDS`` rounds (median of
the rounds' medians). Writes ``results.jsonl`` and ``README.md`` (a table) to --out. Needs ~1-2 minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))   # the repository root: benchmarks.serving

from benchmarks.results_folder import ResultsFolder  # noqa: E402 (after sys.path)
from benchmarks.serving.batches import kernels_ms  # noqa: E402 (after sys.path)

GOAL_PCT = 3.0
ROUNDS = 3
GPT_OSS, LLAMA_70B = (64, 8, 64), (64, 8, 128)       # (N, K, H)
#: (name, (N, K, H), B, S, T, layout): decode_attention on attnlab-decode
DECODE = (("gpt-oss decode", GPT_OSS, 32, 8192, 1, "contig"), ("gpt-oss decode", GPT_OSS, 32, 8192, 4, "contig"),
          ("gpt-oss decode", GPT_OSS, 32, 8192, 16, "contig"), ("gpt-oss decode", GPT_OSS, 32, 8192, 4, "paged16"),
          ("llama-70b decode", LLAMA_70B, 8, 32768, 1, "contig"), ("llama-70b decode", LLAMA_70B, 8, 32768, 4, "contig"))
#: (name, (N, K, H), S_max, prefill chunks, chunk, decodes): serving_attention on the serving kernel
SERVING = (("gpt-oss serving decodes", GPT_OSS, 16384, 0, 0, 64), ("gpt-oss serving mixed", GPT_OSS, 16384, 2, 2048, 126))


def caches(B, S, K, H, layout, seed=0):
    """(k, v) contiguous (B, S, K, H) bf16, and what the call reads: the same or pages of 16 with a table."""
    import jax
    import jax.numpy as jnp

    from attnlab.kernels.pages import to_pages

    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    k, v = (jax.random.normal(x, (B, S, K, H), jnp.bfloat16) for x in (k1, k2))
    if layout == "contig":
        return (k, v), (k, v, None)
    kp, vp, table = to_pages(k, v, int(layout[5:]), seed=0)
    return (k, v), (kp, vp, jnp.asarray(table))


def interleaved_ms(paths: dict, repeats: int) -> dict:
    """CUPTI ms per call of each path (name -> (fn, args)), timed in alternation: median of ROUNDS medians."""
    from attnlab.measure import timers

    got = {n: [] for n in paths}
    for _ in range(ROUNDS):
        for n, (fn, args) in paths.items():
            got[n].append(timers.kernel_per_call(fn, [args], repeats).median)
    return {n: float(np.median(v)) for n, v in got.items()}


def measure(rec, plain, with_sinks, refs_plain, refs_sinks, repeats, out_f):
    """Check both calls against float64, time them, write one record."""
    from benchmarks.serving.checks import check

    (f0, a0), (f1, a1) = plain, with_sinks
    try:
        rec["check_plain"], rec["check_sinks"] = check(f0(*a0), refs_plain), check(f1(*a1), refs_sinks)
        if not all(c["ok"] for c in rec["check_plain"] + rec["check_sinks"]):
            rec["error"] = "check failed"
        else:
            ms = interleaved_ms({"plain": plain, "sinks": with_sinks}, repeats)
            rec.update(plain_ms=ms["plain"], sinks_ms=ms["sinks"], overhead_pct=100 * (ms["sinks"] / ms["plain"] - 1))
            rec["goal_met"] = rec["overhead_pct"] <= GOAL_PCT
            rec["kernels"] = [n for n, _ in kernels_ms(f1, a1, 2)]
    except Exception as e:  # noqa: BLE001 - a case that fails is a result
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(f"{rec['case']:<26} {rec['shape']:<34} {rec.get('plain_ms', 0):8.4f} {rec.get('sinks_ms', 0):8.4f} ms "
          f"{rec.get('overhead_pct', float('nan')):+6.2f}% {rec.get('error', '')}", flush=True)
    out_f.write(json.dumps(rec) + "\n")
    out_f.flush()


def decode_case(name, nkh, B, S, T, layout, dev, repeats, out_f):
    import jax
    import jax.numpy as jnp

    import attnlab
    from attnlab.reference.inputs import random_sinks
    from benchmarks.serving.checks import references

    N, K, H = nkh
    (k, v), (kc, vc, table) = caches(B, S, K, H, layout)
    q = jax.random.normal(jax.random.PRNGKey(T), (B, T, N, H), jnp.bfloat16)
    kv = np.random.default_rng(7).integers(max(T, S // 4), S + 1, B).astype(np.int32)
    kv[0] = S
    sinks = jnp.asarray(random_sinks(N))
    fn = jax.jit(lambda q, k, v, n, t, s: attnlab.decode_attention(q, k, v, n, page_table=t, sinks=s,
                                                                   implementation="attnlab-decode"))
    plain = jax.jit(lambda q, k, v, n, t: attnlab.decode_attention(q, k, v, n, page_table=t,
                                                                   implementation="attnlab-decode"))
    args = (q, kc, vc, jnp.asarray(kv), table)
    starts = np.arange(B + 1, dtype=np.int32) * T
    qf = q.reshape(B * T, N, H)
    flat = lambda f: lambda *a: f(*a).reshape(B * T, N, H)   # noqa: E731 - the check reads packed tokens
    refs = [references(qf, k, v, starts, kv, None, sinks=s) for s in (None, np.asarray(sinks))]
    rec = dict(device=dev, kind="decode", case=name, N=N, K=K, H=H, B=B, S=S, T=T, layout=layout, rows=T * N // K,
               shape=f"B{B} S{S} T{T} N/K {N}/{K} H{H} {layout}")
    measure(rec, (flat(plain), args), (flat(fn), args + (sinks,)), *refs, repeats, out_f)


def serving_case(name, nkh, s_max, chunks, chunk, decodes, dev, repeats, out_f):
    import jax
    import jax.numpy as jnp

    import attnlab
    from attnlab.reference.inputs import random_sinks
    from benchmarks.serving.checks import references

    N, K, H = nkh
    rng = np.random.default_rng(3)
    q_len = np.array([chunk] * chunks + [1] * decodes, np.int32)
    kv = np.maximum(rng.integers(1, s_max + 1, len(q_len)), q_len).astype(np.int32)
    kv[-1] = s_max
    starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    (k, v), (kc, vc, table) = caches(len(kv), s_max, K, H, "contig")
    q = jax.random.normal(jax.random.PRNGKey(5), (int(starts[-1]), N, H), jnp.bfloat16)
    sinks = jnp.asarray(random_sinks(N))
    a, b = jnp.asarray(starts), jnp.asarray(kv)
    plan = jax.jit(lambda a, b: attnlab.serving_plan(a, b, total_tokens=int(q.shape[0]), kv_len_max=s_max, heads=N,
                                                     kv_heads=K, head_dim=H))(a, b)
    fn = jax.jit(lambda q, k, v, a, b, p, s: attnlab.serving_attention(q, k, v, *p.lengths, plan=p, sinks=s,
                                                                       implementation="attnlab-decode"))
    plain = jax.jit(lambda q, k, v, a, b, p: attnlab.serving_attention(q, k, v, *p.lengths, plan=p,
                                                                       implementation="attnlab-decode"))
    args = (q, kc, vc, a, b, plan)
    refs = [references(q, k, v, starts, kv, None, sinks=s) for s in (None, np.asarray(sinks))]
    rec = dict(device=dev, kind="serving", case=name, N=N, K=K, H=H, B=len(kv), S=s_max, T=int(q_len.max()),
               layout="contig", shape=f"{chunks}x{chunk}+{decodes} S{s_max} N/K {N}/{K} H{H}")
    measure(rec, (plain, args), (fn, args + (sinks,)), *refs, repeats, out_f)


def table_md(path) -> str:
    recs = [json.loads(x) for x in open(path, encoding="utf-8") if x.strip()]
    lines = ["| case | shape | kernels | plain ms | sinks ms | sinks cost | goal <= 3% |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in recs:
        kernels = ", ".join(sorted({n.split("_r")[0] if n.startswith("attnlab") else n[:24]
                                    for n in r.get("kernels", [])})) or "–"
        if "overhead_pct" in r:
            got = f"{r['overhead_pct']:+.2f}%"
            verdict = "met" if r["goal_met"] else f"missed by {r['overhead_pct'] - GOAL_PCT:.1f} points"
            lines.append(f"| {r['case']} | {r['shape']} | {kernels} | {r['plain_ms']:.4f} | {r['sinks_ms']:.4f} | "
                         f"{got} | {verdict} |")
        else:
            lines.append(f"| {r['case']} | {r['shape']} | {kernels} | – | – | ✗ {r.get('error', '')[:60]} | – |")
    done = [r for r in recs if "overhead_pct" in r]
    if done:
        worst = max(done, key=lambda r: r["overhead_pct"])
        lines += ["", f"Worst: {worst['overhead_pct']:+.2f}% ({worst['case']}, {worst['shape']}); "
                      f"{sum(r['goal_met'] for r in done)} of {len(done)} cases meet the goal. Every call (plain and "
                      f"with sinks) was checked against float64 before it was timed."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-seconds", type=float, default=100.0, help="no new case starts past this")
    ap.add_argument("--repeats", type=int, default=20, help="CUPTI samples per path and round")
    a = ap.parse_args(argv)
    out = ResultsFolder(a.out)
    with open(out.path, "w") as f:
        for case in DECODE:
            if out.seconds() < a.max_seconds:
                decode_case(*case, out.device, a.repeats, f)
        for case in SERVING:
            if out.seconds() < a.max_seconds:
                serving_case(*case, out.device, a.repeats, f)
    out.finish("Attention sinks in attnlab's kernels", f"python benchmarks/decode/sinks_gpu.py --out {a.out}",
               table_md(out.path))


if __name__ == "__main__":
    main()
