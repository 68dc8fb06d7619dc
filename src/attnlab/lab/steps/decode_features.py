"""The decode step's model features: attnlab's kernel on the step's main shape with a sliding window (gpt-oss's
128 tokens on a GPU), with attention sinks (one logit per query head) and on an FP8 (e4m3) KV cache with
per-token scales, each beside the plain call of the same T. Pure rendering from records, plus the cells' sweeps."""
from __future__ import annotations

from ...core.records import time_ms
from ..render_common import field_text
from ..step_types import Table, jax_side

KERNEL = "attnlab-decode"
#: The cache dtype and scale layout of the quantized row (vLLM's and SGLang's default on Hopper).
FP8 = ("float8_e4m3fn", "token")


def is_feature(r: dict) -> bool:
    """A record of one of these cells: a window, sinks or a quantized cache (not the plain race's)."""
    return bool(r.get("window") or r.get("sinks") or r.get("kv_dtype"))


def sweeps(shp: dict) -> list:
    """One sweep per feature: attnlab's kernel at ``feature_q_lens`` on the main shape (none: no cells)."""
    Sweep = jax_side().Sweep
    if not shp["feature_q_lens"]:
        return []
    common = dict(batch=[shp["batch"]], q_len=shp["feature_q_lens"], kv_len=[shp["kv_len"]], heads=[shp["heads"]],
                  kv_heads=[shp["kv_heads"]], head_dim=[shp["head_dim"]], dtype=[shp["dtype"]], causal=[True],
                  lengths=["full"], name="decode")
    return [Sweep([KERNEL], window=[(shp["window"], 0)], **common), Sweep([KERNEL], sinks=[True], **common),
            Sweep([KERNEL], kv_dtype=[FP8], **common)]


def _order(r: dict) -> int:
    """The rows' order: the window, the sinks, the quantized cache."""
    return 0 if r.get("window") else 1 if r.get("sinks") else 2


def _name(r: dict) -> str:
    if r.get("window"):
        return f"sliding window {r['window'][0]} (local_window_size=({r['window'][0]}, 0))"
    if r.get("sinks"):
        return "attention sinks (one logit per query head)"
    if r.get("kv_dtype"):
        return f"{r['kv_dtype']} cache, scales per {r.get('kv_scale')}"
    return "plain: bf16 cache, no window, no sinks" if r.get("dtype") == "bfloat16" else f"plain: {r.get('dtype')} cache"


def table(records: list[dict], shp: dict) -> Table | None:
    """One row per call at each T of ``feature_q_lens``, the plain one first: time, % of the roofline of its own
    bytes (a window's keys, an FP8 cache's bytes and scales), its time over the plain call's, its error against
    float64 (a quantized cache's: the kernel's on the dequantized cache) and a quantized cache's own error
    against the unquantized values (``kv_rel_err``). None: no feature records."""
    feats = [r for r in records if is_feature(r) and r["backend"] == KERNEL]
    if not feats:
        return None
    main = (shp["heads"], shp["kv_heads"])
    rows, sources = [], []
    for T in sorted({r["q_len"] for r in feats}):
        plain = next((r for r in records if r.get("lengths") == "full" and r["backend"] == KERNEL and r["q_len"] == T
                      and (r.get("heads"), r.get("kv_heads")) == main and not is_feature(r)), None)
        for r in ([plain] if plain else []) + sorted((r for r in feats if r["q_len"] == T), key=_order):
            rows.append([T, _name(r), *_cells(r, plain)])
            sources.append(r)
    return Table(f"{KERNEL} with a model's features, B={shp['batch']} S={shp['kv_len']} N={shp['heads']}/"
                 f"K={shp['kv_heads']} H={shp['head_dim']} {shp['dtype']}, causal",
                 ["T", "call", "time", "% of its roofline", "over the plain call", "rel L2 vs float64",
                  "the cache's own rel L2"], rows, sources=sources,
                 empty_why={"the cache's own rel L2": "no quantized cache measured"})


def _cells(r: dict, plain: dict | None) -> list:
    if r["status"] != "ok":
        return [f"{r['status']}: {(r.get('reason') or '')[:60]}", "", "", "", ""]
    ms = time_ms(r)
    roof = "–" if r.get("pct_roofline") is None else f"{r['pct_roofline']:.0f}%"
    ratio = (f"{ms / time_ms(plain):.3f}×" if plain is not None and plain is not r and plain["status"] == "ok"
             and time_ms(plain) else "–")
    own = "" if r.get("kv_rel_err") is None else f"{r['kv_rel_err']:.2e}"
    return [f"{ms:.4g} ms", roof, ratio, field_text(r, "rel L2 vs float64"), own]


STORY = ("The model-feature rows are the calls a served model makes: a windowed layer (gpt-oss, Gemma, Mistral) "
         "reads only the window's W + T keys, so its roofline is that of those bytes; sinks (gpt-oss) add one "
         "logit per query head to each row's softmax denominator and no bytes; an FP8 cache (vLLM's and SGLang's "
         "default on Hopper) halves the K/V bytes and adds a float32 scale per token and KV head. Each is checked "
         "against float64 before it is timed; the FP8 row's error is the kernel's against the dequantized cache, "
         "then what the cache itself costs against the unquantized K/V.")
