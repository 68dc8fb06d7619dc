"""The decode step's ragged serving batch: ``serving_attention`` on the step's shape at T = 1, every request full
(``uniform``) beside one long request and the rest 1/32 of it (``one-long``), the lengths traced as a jitted
server passes them (``attnlab.measure.serving_cell``). Pure rendering from records, plus the cells' sweep."""
from __future__ import annotations

from ...core.records import time_ms
from ...core.request_lengths import is_distribution
from ..step_types import Table, jax_side
from .decode_features import is_feature

KERNEL = "attnlab-decode"
#: The batches: equal lengths, and the skew that costs a kernel dividing work by the batch the most.
DISTS = ["uniform", "one-long"]


def sweep(shp: dict):
    """The serving cells: attnlab's serving kernel at T = 1 on the step's shape, one cell per ``DISTS`` entry."""
    Sweep = jax_side().Sweep
    return Sweep([KERNEL], batch=[shp["batch"]], q_len=[1], kv_len=[shp["kv_len"]], heads=[shp["heads"]],
                 kv_heads=[shp["kv_heads"]], head_dim=[shp["head_dim"]], dtype=[shp["dtype"]], causal=[True],
                 lengths=DISTS, name="decode")


def is_serving(r: dict) -> bool:
    return is_distribution(r.get("lengths"))


def table(records: list[dict], shp: dict) -> Table | None:
    """One row per batch: its valid KV tokens, time, % of the roofline of its valid work and new tokens per
    second, with decode_attention's full batch at T = 1 on top (None: no serving records)."""
    serving = [r for r in records if is_serving(r) and r["backend"] == KERNEL]
    if not serving:
        return None
    full = next((r for r in records if r.get("lengths") == "full" and r["backend"] == KERNEL and r["q_len"] == 1
                 and (r.get("heads"), r.get("kv_heads")) == (shp["heads"], shp["kv_heads"]) and not is_feature(r)), None)
    rows = [_row("decode_attention, every sequence full", full, shp["batch"] * shp["kv_len"])] if full else []
    for r in sorted(serving, key=lambda r: DISTS.index(r["lengths"]) if r["lengths"] in DISTS else len(DISTS)):
        kv = (r.get("request_lengths") or {}).get("kv_total")
        rows.append(_row(f"serving_attention, {r['lengths']}", r, kv))
    return Table(f"{KERNEL} on a serving batch, lengths traced: B={shp['batch']} S≤{shp['kv_len']} "
                 f"N={shp['heads']}/K={shp['kv_heads']} H={shp['head_dim']} {shp['dtype']}, T=1",
                 ["batch", "valid KV tokens", "time", "% of the valid work's roofline", "new tokens / s"], rows)


def _row(name: str, r: dict | None, kv_tokens) -> list:
    if r is None or r["status"] != "ok":
        return [name, kv_tokens or "–", "" if r is None else f"{r['status']}: {(r.get('reason') or '')[:60]}", "", ""]
    ms = time_ms(r)
    tps = r.get("tokens_per_s") or r["batch"] * r["q_len"] / (ms * 1e-3)
    roof = "–" if r.get("pct_roofline") is None else f"{r['pct_roofline']:.0f}%"
    return [name, kv_tokens or "–", f"{ms:.4g} ms", roof, f"{tps:.4g}"]


STORY = ("A server's batch is never uniform. The serving rows run serving_attention with the lengths as traced "
         "arguments of the jitted step, as a server passes them; their roofline is that of the valid K and V bytes "
         "alone, so a kernel that divides its work by the batch instead of by the valid tokens (the long request's "
         "programs still running while the short ones' SMs idle) shows it as a lower percentage on the skewed "
         "batch (docs/serving.md).")
