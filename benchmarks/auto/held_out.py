"""Issue 16's goal for measured auto: on shapes it was NOT tuned on, auto within 5% of the best correct backend.

(a) ``tune``: measure the TUNE shapes with the JAX backends auto may pick and write the dispatch table
after each shape (so a time-out still leaves one). (b) ``heldout``: record the backend ``api.auto``
picks with that table and the static rule's pick (``picks``), then measure the HELDOUT shapes (never
tuned, each in a tuned bucket: ``check_sets``) with every backend. (c) ``score``/``summary``/``markdown``
(pure): for each held-out cell, the picks' median CUPTI kernel times (ms) against the fastest ``ok``
record; the goal is auto within 5% on >= 95% of cells. ``run`` does (a), (b), (c) under a wall-clock
budget that stops *starting* new cells. benchmarks/auto/goal.py is the command line.
"""
from __future__ import annotations

import json
import os
import time

from attnlab import backends as registry
from attnlab.core.problem import Problem
from attnlab.core.records import time_ms

#: The contenders auto's pick is scored against (``Backend.peer_parts`` "auto"); the JAX ops among them
#: are those the dispatch table is tuned on.
ALL_BACKENDS = registry.peers("auto")
JAX_BACKENDS = [n for n in ALL_BACKENDS if not registry.get(n).native]
WITHIN = 0.05       # auto's time may exceed the best correct backend's by at most this fraction
GOAL = 0.95         # ... on at least this fraction of held-out cells
TUNE_SHARE = 0.45   # with ``all``: tune stops starting cells after this share of --max-seconds
BF = "bfloat16"


def P(B, T, N, K, H, causal):
    return Problem(B, T, T, N, K, H, BF, causal=causal)


#: (problem, mode), each the bucket of one held-out shape below (the most telling first: a time-out cuts the last).
#: Measured cost on the H200: ~20 s a shape (the references ~9 s, then ~1-2 s a backend).
TUNE = [
    (P(1, 16384, 16, 16, 128, True), "fwd"),      # issue 16: static rule loses 8.8% here (tokamax-mosaic)
    (P(4, 4096, 8, 8, 128, False), "fwd"),
    (P(2, 8192, 32, 8, 64, True), "fwd"),
    (P(1, 4096, 16, 16, 256, False), "fwd"),
    (P(1, 16384, 8, 8, 256, True), "fwd"),
    (P(1, 4096, 32, 32, 128, True), "fwd+bwd"),
    (P(1, 8192, 32, 8, 128, False), "fwd+bwd"),
    (P(1, 16384, 16, 16, 64, True), "fwd+bwd"),
    (P(8, 2048, 32, 32, 64, True), "fwd"),
    (P(1, 16384, 32, 8, 128, False), "fwd"),
]
#: Held-out shapes: each in a bucket of TUNE (T rounds up to the tuned power of two, B·N too), none tuned.
HELDOUT = [
    (P(1, 12288, 16, 16, 128, True), "fwd"),
    (P(2, 3072, 16, 16, 128, False), "fwd"),
    (P(2, 6144, 32, 8, 64, True), "fwd"),
    (P(1, 3072, 16, 16, 256, False), "fwd"),
    (P(1, 12288, 8, 8, 256, True), "fwd"),
    (P(2, 3072, 16, 16, 128, True), "fwd+bwd"),
    (P(1, 6144, 24, 8, 128, False), "fwd+bwd"),
    (P(1, 12288, 16, 16, 64, True), "fwd+bwd"),
    (P(8, 1536, 32, 32, 64, True), "fwd"),
    (P(1, 12288, 24, 8, 128, False), "fwd"),
]


def check_sets(tune=None, heldout=None) -> None:
    """Assert the held-out set is disjoint from the tuning set and lies in its buckets."""
    from attnlab.api import dispatch

    tune, heldout = tune or TUNE, heldout or HELDOUT
    tuned = {(p, m) for p, m in tune}
    same = [f"{p.label} {m}" for p, m in heldout if (p, m) in tuned]
    assert not same, f"held-out shapes that are tuned: {same}"
    buckets = {dispatch.bucket(p, m) for p, m in tune}
    outside = [f"{p.label} {m}" for p, m in heldout if dispatch.bucket(p, m) not in buckets]
    assert not outside, f"held-out shapes outside every tuned bucket: {outside}"


class OutOfTime(Exception):
    pass


def default_options():
    """The measuring options of the H200 run: 10 timed calls, 60 s compile budget, 5 pipelined calls."""
    from attnlab.measure import Options

    return Options(repeats=10, compile_budget_s=60, pipelined_calls=5)


def _measure(shapes, backends, out_dir, deadline, options, after_shape=None, log=print):
    """Each (problem, mode) as a one-problem sweep into ``out_dir`` (resumed); stops starting cells at
    ``deadline`` (``time.monotonic()`` seconds)."""
    from attnlab.sweep import run_sweep
    from attnlab.sweep.spec import Sweep

    def on_cell(c, r, i, n):
        if r is not None:
            log(f"  {c.backend:<15} {c.config_label:<52} {r['status']:<12} {r['kernel_ms'] or r['wall_ms'] or 0:9.4f} ms "
                f"cell {r.get('cell_s') or 0:5.1f} s {(r['reason'] or '')[:50]}", flush=True)
        if time.monotonic() > deadline and i + 1 < n:
            raise OutOfTime

    records = []
    for j, (p, mode) in enumerate(shapes):
        if time.monotonic() > deadline:
            log(f"out of time: {len(shapes) - j} shape(s) not started", flush=True)
            break
        sw = Sweep(list(backends), batch=[p.batch], q_len=[p.q_len], kv_len=[p.kv_len], heads=[p.heads],
                   kv_heads=[p.kv_heads], head_dim=[p.head_dim], dtype=[p.dtype], causal=[p.causal], mode=[mode],
                   name=os.path.basename(out_dir))
        log(f"[{j + 1}/{len(shapes)}] {p.label} {mode}", flush=True)
        try:
            records += run_sweep(sw, out_dir, resume=True, options=options, on_cell=on_cell)
        except OutOfTime:
            log("out of time: stopped starting cells", flush=True)
            break
        finally:
            if after_shape:
                after_shape()
    return records


def _read(path):
    from attnlab.core.store import read_records

    return read_records(path) if os.path.exists(path) else []


def _usable(names):
    """The backends of ``names`` available here (the others said and skipped)."""
    from attnlab import backends

    out = []
    for name in names:
        why = backends.get(name).available()
        if why:
            print(f"  (skipping {name}: {why})", flush=True)
        else:
            out.append(name)
    return out


def tune(out, deadline, shapes=TUNE, backends=JAX_BACKENDS, options=None):
    """(a) ``shapes`` with ``backends`` into OUT/tune/; OUT/dispatch.json rewritten after each shape."""
    from attnlab.sweep.tune import write_table

    d = os.path.join(out, "tune")
    table = os.path.join(out, "dispatch.json")

    def write():
        recs = _read(os.path.join(d, "results.jsonl"))
        if recs:
            write_table(recs, table, replace=True)
    _measure(shapes, _usable(backends), d, deadline, options or default_options(), after_shape=write)
    print(f"dispatch table -> {table}", flush=True)


def picks(shapes, table):
    """(problem, mode) -> {auto, auto_why, static, static_why}: auto with ``table``, and the static rule."""
    from attnlab.api import dot_product as api, dispatch
    from attnlab.core.call import Call

    before = os.environ.get(dispatch.ENV_VAR)
    os.environ[dispatch.ENV_VAR] = os.path.abspath(table)
    out = []
    try:
        for p, mode in shapes:
            spec = Call(p)
            a, why = api.auto(spec, "train" if mode != "fwd" else "fwd")
            s, swhy = api.static_rule(spec)
            out.append({**p.identity(), "mode": mode, "bucket": dispatch.bucket(p, mode), "auto": a.name, "auto_why": why,
                        "static": s.name, "static_why": swhy})
    finally:   # the table is this run's, not the process's (a test process goes on after it)
        if before is None:
            os.environ.pop(dispatch.ENV_VAR, None)
        else:
            os.environ[dispatch.ENV_VAR] = before
    return out


def heldout(out, deadline, shapes=HELDOUT, backends=ALL_BACKENDS, options=None):
    """(b) the picks of ``shapes`` with OUT/dispatch.json -> OUT/picks.jsonl, then ``shapes`` measured
    with ``backends`` into OUT/heldout/."""
    table = os.path.join(out, "dispatch.json")
    assert os.path.exists(table), f"{table} missing: run `tune {out}` first"
    with open(os.path.join(out, "picks.jsonl"), "w") as f:
        for row in picks(shapes, table):
            f.write(json.dumps(row) + "\n")
            print(f"  auto picks {row['auto']:<15} static {row['static']:<8} {Problem.of(row).label} {row['mode']}: "
                  f"{row['auto_why']}", flush=True)
    _measure(shapes, _usable(backends), os.path.join(out, "heldout"), deadline, options or default_options())


# --- (c) the score: pure, on records and picks -------------------------------------------------

def _ms(r):
    if r is None or r.get("status") != "ok":
        return None
    return time_ms(r)


def score(records, pick_rows, within=WITHIN):
    """One row per held-out cell measured: best correct backend and time (ms), auto's and the static
    rule's pick, time and ratio to the best, and whether each is within ``within``. A pick whose record
    is not ``ok`` has no time and is not within; a cell without a record of both picks is left out."""
    by: dict[tuple, dict] = {}
    for r in records:
        by.setdefault((Problem.of(r), r["mode"]), {})[r["backend"]] = r
    rows = []
    for pk in pick_rows:
        key = (Problem.of(pk), pk["mode"])
        cell = by.get(key)
        if not cell:
            continue
        ok = {b: _ms(r) for b, r in cell.items() if _ms(r)}
        if not ok or pk["auto"] not in cell or pk["static"] not in cell:
            continue     # not (fully) measured: a time-out stopped it; a pick measured and not ok is a miss
        best = min(ok, key=ok.get)
        row = {"label": f"{key[0].label} {key[1]}", "best": best, "best_ms": ok[best]}
        for who in ("auto", "static"):
            t = ok.get(pk[who])
            row.update({who: pk[who], f"{who}_ms": t, f"{who}_ratio": t / ok[best] if t else None,
                        f"{who}_within": bool(t and t <= (1 + within) * ok[best])})
        row["auto_why"] = pk.get("auto_why")
        rows.append(row)
    return rows


def summary(rows, held_out: int | None = None):
    """Counts of ``rows`` (scored cells): within 5%, for auto and the static rule; ``held_out`` the
    number of held-out shapes there were (those not scored were cut by the time budget), and how
    many scored picks came from a dispatch entry (the rest fell back to the static rule)."""
    n = len(rows)
    a = sum(r["auto_within"] for r in rows)
    s = sum(r["static_within"] for r in rows)
    measured = sum((r.get("auto_why") or "").startswith("measured") for r in rows)
    return {"cells": n, "held_out": held_out if held_out is not None else n, "measured_picks": measured,
            "auto_within": a, "static_within": s, "auto_fraction": a / n if n else None,
            "static_fraction": s / n if n else None, "goal": GOAL, "within": WITHIN,
            "met": bool(n) and a / n >= GOAL}


def markdown(rows, summ) -> str:
    f = lambda x: "–" if x is None else f"{x:.4g}"  # noqa: E731
    pct = lambda x: "–" if x is None else f"{100 * (x - 1):+.1f}%"  # noqa: E731
    lines = ["| held-out cell | best (ms) | auto | auto ms | vs best | static | static ms | vs best |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['best']} {f(r['best_ms'])} | {r['auto']} | {f(r['auto_ms'])} | "
                     f"{pct(r['auto_ratio'])}{'' if r['auto_within'] else ' ✗'} | {r['static']} | {f(r['static_ms'])} | "
                     f"{pct(r['static_ratio'])}{'' if r['static_within'] else ' ✗'} |")
    n = summ["cells"]
    lines.append("")
    lines.append(f"auto within {100 * WITHIN:.0f}% of the best correct backend on {summ['auto_within']} of {n} held-out "
                 f"cells ({100 * (summ['auto_fraction'] or 0):.0f}%; goal >= {100 * GOAL:.0f}%: "
                 f"{'met' if summ['met'] else 'NOT met'} on the cells scored); static rule: {summ['static_within']} of {n}.")
    left = summ.get("held_out", n) - n
    lines.append(f"Scored {n} of {summ.get('held_out', n)} held-out shapes"
                 + (f" ({left} not measured: the time budget stopped them; left out)" if left else "")
                 + f"; {summ.get('measured_picks', n)} of the {n} picks came from a dispatch entry, the others from"
                   " the static rule (their bucket has no entry).")
    return "\n".join(lines) + "\n"


def table(out):
    recs = _read(os.path.join(out, "heldout", "results.jsonl"))
    with open(os.path.join(out, "picks.jsonl")) as f:
        pk = [json.loads(line) for line in f if line.strip()]
    rows = score(recs, pk)
    summ = summary(rows, held_out=len(pk))
    md = markdown(rows, summ)
    with open(os.path.join(out, "goal.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "goal.json"), "w") as f:
        json.dump({"summary": summ, "rows": rows}, f, indent=1)
    print(md, end="")
    return summ


def run(what, out, max_seconds=390.0, *, tune_shapes=TUNE, heldout_shapes=HELDOUT, tune_backends=JAX_BACKENDS,
        all_backends=ALL_BACKENDS, options=None):
    """``what`` in all / tune / heldout / table on OUT; ``max_seconds`` of wall time stops starting cells
    (all: tune + held-out, tune getting at most TUNE_SHARE). Returns the summary (all, table) or None."""
    if what not in ("all", "tune", "heldout", "table"):
        raise ValueError(f"what: {what!r} is not one of all, tune, heldout, table")
    check_sets(tune_shapes, heldout_shapes)
    os.makedirs(out, exist_ok=True)
    t0 = time.monotonic()
    if what in ("all", "tune"):
        share = TUNE_SHARE if what == "all" else 1.0
        tune(out, t0 + share * max_seconds, tune_shapes, tune_backends, options)
    if what in ("all", "heldout"):
        end = t0 + max_seconds if what == "all" else time.monotonic() + max_seconds
        heldout(out, end, heldout_shapes, all_backends, options)
    summ = table(out) if what in ("all", "table") else None
    if summ is not None:
        print(json.dumps(summ), flush=True)
    print(f"wall {time.monotonic() - t0:.0f} s", flush=True)
    return summ
