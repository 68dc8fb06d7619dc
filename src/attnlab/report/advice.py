"""``attnlab advise``'s answer from records: pure (no JAX), so it is tested on canned records.

``advise(preset, entries, records, device_bytes=...)`` -> a JSON-able dict:

- ``cells``: one row per plan entry (phase, context, layer kind, T): every backend's status and time
  (ms, one layer), the fastest **correct** backend (status ``ok`` only: an incorrect, unsupported,
  failed or unchecked cell is never chosen) and its time per layer;
- ``phases``: one row per (phase, context, T): the whole model's time in ms (sum over layer kinds of
  the kind's fastest time x its layers; Gemma-2: windowed and global layers weighted by count), and
  for decode ms per token (the step's time / T: every sequence of the batch gains T tokens a step);
  ``missing``: the layer kinds with no correct backend, ``not_run`` those of them the cell budget kept
  from running (``over_budget``: "not run: over budget", never "none correct");
- ``memory``: per context, KV-cache bytes per sequence (bf16; windowed layers cache only their window,
  a rolling buffer of min(context, W + 1) tokens; the every-layer-caches-all figure beside it), the
  weights in bf16 (``params`` x 2 bytes), and the largest batch whose KV cache fits in the device's
  memory beside the weights (activations and workspace not counted); ``by_kv_dtype``: per cache dtype
  (bf16, fp8 e4m3, int8 with per-token float32 scales) the bytes per token (every layer) and per
  sequence and the largest batch.
Times are milliseconds, sizes bytes.
"""
from __future__ import annotations

import math

from ..core.model_plan import PlanEntry, notes as plan_notes
from ..core.models import ModelPreset
from ..core.records import time_ms
from .footnotes import Footnotes

KV_CONVENTION = ("KV cache: K and V in bf16; a windowed layer caches only min(context, W + 1) tokens (rolling "
                 "buffer), a global layer every token")
MEMORY_CONVENTION = "max batch: (device memory - weights in bf16) // KV bytes per sequence; weights bf16 assumed, " \
                    "activations and workspace not counted"
#: The KV cache dtypes the memory table compares: (name, label, bytes per element); a 1-byte cache carries float32
#: scales per (token, KV head) for K and V (attnlab.core.kv_quant's ``token`` layout: +4/H per element).
KV_CACHE_DTYPES = (("bfloat16", "bf16", 2), ("float8_e4m3fn", "fp8", 1), ("int8", "int8", 1))
KV_DTYPE_CONVENTION = ("KV cache per cache dtype: bf16 2 bytes per element; fp8 (e4m3) and int8 1 byte plus float32 "
                       "scales per (token, KV head) for K and V (4 bytes each; vLLM's per-tensor scales cost none)")


def _best(by: dict[str, dict], leave_out=frozenset()) -> tuple[str | None, float | None]:
    ok = [(time_ms(r), b) for b, r in by.items()
          if r.get("status") == "ok" and time_ms(r) is not None and b not in leave_out]
    if not ok:
        return None, None
    ms, b = min(ok)
    return b, ms


def cell_rows(entries: list[PlanEntry], records: list[dict], non_jax=frozenset()) -> list[dict]:
    """One row per entry: ``backends`` (name -> status, ms, reason), ``best``, ``best_ms`` (one layer);
    when ``best`` is in ``non_jax`` (a PyTorch peer: not callable from JAX), ``best_jax``/``best_jax_ms``
    name the fastest correct JAX path beside it."""
    rows = []
    for e in entries:
        by: dict[str, dict] = {}
        for r in records:
            if e.matches(r):
                by.setdefault(r["backend"], r)
        best, best_ms = _best(by)
        jax_best, jax_ms = _best(by, non_jax) if best in non_jax else (None, None)
        rows.append({"phase": e.phase, "context": e.context, "kind": e.kind, "layers": e.layers, "q_len": e.q_len,
                     "kv_len": e.kv_len, "window": list(e.window) if e.window else None, "mode": e.mode, "sinks": e.sinks,
                     "backends": {b: {"status": r["status"], "ms": time_ms(r) if r["status"] in ("ok", "unchecked")
                                      else None, "reason": r.get("reason"), "estimate_s": r.get("estimate_s")}
                                  for b, r in by.items()},
                     "best": best, "best_ms": best_ms, "best_native": best in non_jax,
                     "best_jax": jax_best, "best_jax_ms": jax_ms})
    return rows


def phase_rows(cells: list[dict]) -> list[dict]:
    """Per (phase, context, T): whole-model ms (None when a layer kind has no correct backend), per token."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["phase"], c["context"], c["q_len"]), []).append(c)
    out = []
    for (phase, ctx, t), cs in groups.items():
        missing = [c["kind"] for c in cs if c["best_ms"] is None]
        model_ms = None if missing else sum(c["best_ms"] * c["layers"] for c in cs)
        out.append({"phase": phase, "context": ctx, "q_len": t,
                    "per_layer": {c["kind"]: {"best": c["best"], "ms": c["best_ms"], "layers": c["layers"],
                                              "text": _best_text(c)} for c in cs},
                    "model_ms": model_ms, "per_token_ms": model_ms / t if model_ms is not None and phase == "decode" else None,
                    "missing": missing,
                    "not_run": [c["kind"] for c in cs if c["best_ms"] is None and _none_text(c).startswith("not run")]})
    return out


def memory_rows(preset: ModelPreset, contexts: list[int], device_bytes: int | None) -> list[dict]:
    """Per context: KV bytes per sequence (windowed and full conventions), weights, the largest batch."""
    weights = preset.weight_bytes(2)
    out = []
    for ctx in contexts:
        kv = preset.kv_cache_bytes(ctx, 2, windowed=True)
        free = None if device_bytes is None or weights is None else device_bytes - weights
        by_dtype = {}
        for name, _, size in KV_CACHE_DTYPES:
            per_token, per_seq = (kv_bytes_as(preset.kv_cache_bytes(n, 1, windowed=w), preset.head_dim, size)
                                  for n, w in ((1, False), (ctx, True)))
            by_dtype[name] = {"bytes_per_token": per_token, "kv_bytes_per_seq": per_seq,
                              "max_batch": None if free is None else max(0, free // per_seq)}
        out.append({"context": ctx, "kv_bytes_per_seq": kv, "kv_bytes_per_seq_all_layers_full":
                    preset.kv_cache_bytes(ctx, 2), "weights_bytes": weights, "device_bytes": device_bytes,
                    "free_bytes": free, "max_batch": None if free is None else max(0, free // kv),
                    "by_kv_dtype": by_dtype})
    return out


def kv_bytes_as(elements: int, head_dim: int, itemsize: int) -> int:
    """Bytes of ``elements`` K/V cache elements at ``itemsize``; a 1-byte (quantized) cache adds its float32 scales,
    one per head_dim elements (per token and KV head)."""
    return elements * itemsize + (4 * elements // head_dim if itemsize == 1 else 0)


def budget_flag(reason: str | None) -> str:
    """The flag whose budget kept an ``over_budget`` cell from running: ``--compile-budget`` where its compile ran
    past it (``attnlab.measure.budget``), else ``--cell-budget`` (estimated above it, never compiled)."""
    return "--compile-budget" if reason and "--compile-budget" in reason else "--cell-budget"


def over_budget_notes(cells: list[dict]) -> list[str]:
    """How to run the cells recorded ``over_budget``, per budget: the ``--cell-budget`` above their largest
    estimate (seconds), a larger ``--compile-budget`` for those whose compile ran past it."""
    skipped = [x for c in cells for x in c["backends"].values() if x["status"] == "over_budget"]
    compiled = [x for x in skipped if budget_flag(x["reason"]) == "--compile-budget"]
    ests = [x.get("estimate_s") for x in skipped if budget_flag(x["reason"]) == "--cell-budget"]
    notes = []
    if ests:
        known = [e for e in ests if e]
        need = f"--cell-budget {math.ceil(max(known) * 1.2)}" if known else "a larger --cell-budget"
        notes.append(f"{len(ests)} cell(s) not run: estimated above the cell budget (over_budget); to run them give "
                     f"{need} (seconds a cell may take)")
    if compiled:
        notes.append(f"{len(compiled)} cell(s) not run: their compile ran past the compile budget (over_budget); to "
                     f"run them give a larger --compile-budget (seconds a compile may take)")
    return notes


def advise(preset: ModelPreset, entries: list[PlanEntry], records: list[dict], *, batch: int = 1,
           device_bytes: int | None = None, device_kind: str | None = None,
           device_bytes_source: str | None = None, non_jax=frozenset()) -> dict:
    """The whole answer (see the module docstring) as a JSON-able dict; ``non_jax``: the backends that
    are not JAX ops (PyTorch peers), for which the fastest JAX path is named beside them. A cell whose
    backends were not run for the cell budget says so ("not run: over budget") and a note gives the
    ``--cell-budget`` that runs them."""
    contexts = list(dict.fromkeys(e.context for e in entries))
    cells = cell_rows(entries, records, frozenset(non_jax))
    backends_ = list(dict.fromkeys(b for c in cells for b in c["backends"]))
    notes = plan_notes(preset, contexts) + [KV_CONVENTION, MEMORY_CONVENTION, KV_DTYPE_CONVENTION,
                                            "decode per token = whole-model step time / T (T new tokens per sequence "
                                            "a step, all sequences of the batch at once)",
                                            "fastest = the fastest backend whose cell is ok (checked correct, then "
                                            "timed); incorrect, unsupported or failed cells are never chosen"]
    if device_bytes is None:
        notes.append("device memory unknown here (JAX gives no memory_stats, e.g. on a CPU; --device-memory GiB sets it): no max batch")
    elif preset.weight_bytes(2) is None:
        notes.append(f"{preset.name}: no parameter count (a config.json gives none), so no weights and no max batch")
    notes += over_budget_notes(cells)
    mem = memory_rows(preset, contexts, device_bytes)
    if any(m["free_bytes"] is not None and m["free_bytes"] <= 0 for m in mem):
        notes.append(f"{preset.name}: the bf16 weights alone ({preset.weight_bytes(2) / 2**30:.0f} GiB) exceed this "
                     f"device's memory: the model needs several devices (max batch 0 on one)")
    return {"model": preset.name, "batch": batch, "contexts": contexts, "device_kind": device_kind,
            "device_bytes": device_bytes, "device_bytes_source": device_bytes_source, "params_billion": preset.params,
            "backends": backends_, "cells": cells, "phases": phase_rows(cells), "memory": mem, "notes": notes}


# --- text for the terminal and the HTML page ------------------------------------------------------

def fmt_ms(ms: float | None) -> str:
    return "–" if ms is None else f"{ms:.4g}"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "–"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _none_text(c: dict) -> str:
    """Why a cell has no fastest correct backend: "none correct" only where a backend ran and failed
    its check (or could not run); "not run: over budget (FLAG)" where a budget kept them all from running."""
    statuses = {x["status"] for x in c["backends"].values()}
    if "over_budget" not in statuses:
        return "none correct"
    flags = ", ".join(sorted({budget_flag(x["reason"]) for x in c["backends"].values() if x["status"] == "over_budget"}))
    if statuses <= {"over_budget", "unsupported"}:
        return f"not run: over budget ({flags})"
    return f"none correct of those run; others not run: over budget ({flags})"


def _best_text(c: dict) -> str:
    """``cudnn``, or ``torch-cudnn (PyTorch; JAX: cudnn 0.0379 ms)`` when the fastest is no JAX op."""
    if not c["best"]:
        return _none_text(c)
    if not c.get("best_native"):
        return c["best"]
    jax_ = f"{c['best_jax']} {fmt_ms(c['best_jax_ms'])} ms" if c.get("best_jax") else "none correct"
    return f"{c['best']} (PyTorch; JAX: {jax_})"


def _step(c: dict) -> str:
    return f"T={c['q_len']}" if c["phase"] == "decode" else c["mode"]


def tables(adv: dict) -> list[dict]:
    """The advice as tables: {title, columns, rows (strings), key (how many first columns name a row: the
    compact layout prints them as the row's line)}; the CLI and the HTML page both show these."""
    be = adv["backends"]
    side = {"title": "one layer, every backend (ms; fastest correct marked *)", "key": 4,
            "columns": ["phase", "context", "layers", "cell", *be, "fastest correct"], "rows": []}
    notes = Footnotes()     # a cell not timed: its status and the number of its reason under the table
    for c in adv["cells"]:
        cells = []
        for b in be:
            x = c["backends"].get(b)
            if x is None:
                cells.append("")
            elif x["status"] == "ok":
                cells.append(fmt_ms(x["ms"]) + (" *" if b == c["best"] else ""))
            else:
                cells.append(notes.mark(b, x["status"], x.get("reason")))
        cell = f"T{c['q_len']} S{c['kv_len']}" + (f" w{c['window'][0]}:0" if c["window"] else "") + (
            " sinks" if c.get("sinks") else "")
        side["rows"].append([c["phase"] + " " + _step(c) if c["phase"] == "decode" else c["phase"], str(c["context"]),
                             f"{c['layers']} {c['kind']}", cell, *cells, _best_text(c)])
    summary = {"title": f"{adv['model']}, batch {adv['batch']}: the fastest correct path per phase",
               "key": 2, "columns": ["phase", "context", "backend per layer kind", "ms / layer", "ms whole model",
                           "ms / token"], "rows": []}
    for p in adv["phases"]:
        kinds = p["per_layer"]
        backend = ", ".join(f"{k}: {v['text']}" for k, v in kinds.items())
        per_layer = ", ".join(f"{k}: {fmt_ms(v['ms'])}" for k, v in kinds.items()) if len(kinds) > 1 else \
            fmt_ms(next(iter(kinds.values()))["ms"])
        name = f"decode T={p['q_len']}" if p["phase"] == "decode" else p["phase"]
        summary["rows"].append([name, str(p["context"]), backend, per_layer, fmt_ms(p["model_ms"]),
                                fmt_ms(p["per_token_ms"]) if p["phase"] == "decode" else ""])
    memory = {"title": f"KV cache and the largest batch ({adv.get('device_kind') or 'this device'}: "
                       f"{fmt_bytes(adv.get('device_bytes'))}" + (f", {adv['device_bytes_source']}"
                                                                  if adv.get("device_bytes_source") else "") + ")",
              "key": 1, "columns": ["context", "KV / sequence", "KV / seq. (every layer full)", "weights (bf16)", "max batch",
                                    *(f"{label}: KV / token, max batch" for _, label, _ in KV_CACHE_DTYPES)],
              "rows": [[str(m["context"]), fmt_bytes(m["kv_bytes_per_seq"]),
                        fmt_bytes(m["kv_bytes_per_seq_all_layers_full"]), fmt_bytes(m["weights_bytes"]),
                        "–" if m["max_batch"] is None else str(m["max_batch"]),
                        *(_per_dtype(m.get("by_kv_dtype", {}).get(name)) for name, _, _ in KV_CACHE_DTYPES)]
                       for m in adv["memory"]]}
    side["footnotes"] = notes.lines()
    return [summary, side, memory]


def _per_dtype(d: dict | None) -> str:
    if d is None:
        return "–"
    return f"{fmt_bytes(d['bytes_per_token'])}, {'–' if d['max_batch'] is None else d['max_batch']}"


__all__ = ["advise", "cell_rows", "phase_rows", "memory_rows", "tables", "fmt_bytes", "fmt_ms"]
