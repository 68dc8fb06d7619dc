"""Decode cells on a quantized KV cache (``Cell.kv_dtype``, ``bench --kv-dtype``): the call, its check, its error.

A cell with ``kv_dtype`` (``float8_e4m3fn``, ``float8_e5m2`` or ``int8``) and ``kv_scale`` (the scale layout,
default ``token``; ``attnlab.core.kv_quant``) is a forward decode cell whose timed call reads the cache
quantized by ``attnlab.quantize_kv_cache`` (made before timing, from the cell's drawn K/V in its dtype, the
"unquantized values"; a paged cell quantizes its pages) with its scales.

Its check (before timing; ``check.check_into`` then judges every sequence against float32 of the whole dequantized
cache): the sampled batch elements (every one up to ``CHECKED_SEQUENCES``, else that many spread evenly from the
first to the last) against float64 of the *dequantized* cache (``decode64.dequantized_errors``: ``check_decode_close``'s decode tolerance policy, the
kernel-like emulation as its baseline), so the check judges the kernel and not the quantization. The cache it
dequantizes is the timed call's own, its codes and scales of the first set (quantized once, as a serving cell's
is; ``reference.dequant64``, apart from the paths' ``kv_quant``, reads a paged cache through its table). The cost of
the quantization goes to the record beside it: ``kv_rel_err``, the same output's relative L2 error against
float64 of the unquantized K/V.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..api.decode import decode_attention
from ..core.kv_quant import SCALE_LAYOUTS, canonical_kv_dtype, quantize_kv_cache
from ..kernels.pages import to_pages
from ..reference.decode64 import dequantized_errors, reference_decode_attention
from ..reference.dequant64 import dequantized_sequences64
from ..reference.inputs import make_qkv
from ..reference.tolerance import rel_l2
from .outcome import judged

#: Batch elements a quantized cell's float64 check reads at most (each dequantized in float64 on the host): a
#: wrong sequence (its scales, lengths or table) must not hide among unsampled ones in the batches a sweep runs
CHECKED_SEQUENCES = 8


def cell_fields(kv_dtype, kv_scale) -> tuple:
    """(("kv_dtype", canonical name or None), ("kv_scale", layout or None)): a cache dtype's layout defaults
    to ``token``."""
    if kv_dtype is None:
        return ("kv_dtype", None), ("kv_scale", kv_scale)
    return ("kv_dtype", canonical_kv_dtype(kv_dtype)), ("kv_scale", kv_scale or "token")


def validate(cell) -> None:
    """The rules of a quantized-cache cell: a forward decode cell, a known layout, ``page`` on paged caches only."""
    if cell.kv_dtype is None:
        if cell.kv_scale is not None:
            raise ValueError(f"kv_scale={cell.kv_scale!r} needs a kv_dtype")
        return
    if cell.lengths is None or cell.mode != "fwd":
        raise ValueError(f"kv_dtype={cell.kv_dtype}: a quantized KV cache needs a forward decode cell (lengths set, "
                         f"mode fwd), got lengths={cell.lengths!r}, mode={cell.mode!r}")
    if cell.kv_scale not in SCALE_LAYOUTS:
        raise ValueError(f"kv_scale must be one of {', '.join(SCALE_LAYOUTS)}, got {cell.kv_scale!r}")
    if cell.kv_scale == "page" and cell.page_size is None:
        raise ValueError("kv_scale 'page' (one scale per page and KV head) needs a paged cell (lengths paged, "
                         "or a serving cell's DIST:pagedN)")


def quantized_caches(cell, k, v):
    """(k_cache, k_scale, v_cache, v_scale[, page_table]) of the cell's timed call from its K/V (B, S, K, H)."""
    tail = ()
    if cell.lengths == "paged":
        k, v, table = to_pages(k, v, cell.page_size)
        tail = (table,)
    (kc, ks), (vc, vs) = (quantize_kv_cache(x, cell.kv_dtype, cell.kv_scale) for x in (k, v))
    return (kc, ks, vc, vs, *tail)


def semantics(cell, extras: dict) -> dict:
    """The cell's window and sinks, as the call and both references take them (the sinks of the call's keyword
    arguments ``extras``, ``inputs.call_extras``, as NumPy)."""
    sinks = extras.get("sinks")
    return dict(local_window_size=cell.window, sinks=None if sinks is None else np.asarray(sinks))


def functions(cell, lens, extras: dict):
    """(forward fn(q, k, v), timed fn(q, k_cache, k_scale, v_cache, v_scale[, table]), its argument maker);
    ``extras``: the call's keyword arguments (``inputs.call_extras``)."""
    extra = semantics(cell, extras)

    def timed(q, kc, ks, vc, vs, table=None):
        return decode_attention(q, kc, vc, lens, causal=cell.causal, implementation=cell.backend,
                                        page_table=table, logits_soft_cap=cell.soft_cap, k_scale=ks, v_scale=vs,
                                        **extra)

    def fwd(q, k, v):
        return timed(q, *quantized_caches(cell, k, v))

    return fwd, timed, lambda q, k, v, ct: (q, *quantized_caches(cell, k, v))


def check_output(out, inputs, caches, cell, extras: dict) -> dict:
    """The check of a quantized-cache cell (module docstring) on its first input set ``inputs`` (q, k, v), the
    timed call's caches of that set ``caches`` (k_cache, k_scale, v_cache, v_scale[, page_table]:
    ``quantized_caches``; the check dequantizes the sampled sequences of these very codes) and the call's keyword
    arguments ``extras``: its fields, ``kv_rel_err`` included; raises Skip('incorrect') with them when it fails.
    The output's dtype is the cell's (``check.check_into`` saw to it)."""
    q, k, v = inputs
    kc, ks, vc, vs, *table = caches
    bi = sorted({int(round(x)) for x in np.linspace(0, cell.batch - 1, min(cell.batch, CHECKED_SEQUENCES))})
    lens = np.asarray(cell.kv_lengths())[bi]
    qs, o = np.asarray(q)[bi], np.asarray(out)[bi]
    kw = dict(causal=cell.causal, logits_soft_cap=cell.soft_cap, **semantics(cell, extras))
    kd, vd = (dequantized_sequences64(c, s, bi, *table) for c, s in ((kc, ks), (vc, vs)))
    v64, kv_rel_err = dequantized_errors(o, qs, kd, vd, np.asarray(k)[bi], np.asarray(v)[bi], lens, **kw)
    rule = f"{v64.rule}; against the float64 of the dequantized cache (sampled batch elements {bi})"
    verdict = {"ok": v64.ok, "rel_err": v64.rel_err, "limit": v64.limit, "batch": bi,
               "margin": v64.limit / v64.rel_err if v64.rel_err > 0 else None,
               "reference": "NumPy float64 of the dequantized cache"}
    fields = dict(checked_fraction=len(bi) / cell.batch, checked_rows=len(bi) * cell.q_len,
                  max_abs_err=v64.max_abs_err, kv_rel_err=kv_rel_err)
    return judged(fields, "float64_dequantized", verdict, rule)


def kv_cache_errors(B: int, T: int, S: int, N: int, K: int, H: int, *, kv_dtypes=("float8_e4m3fn",),
                    kv_scale: str = "token", distributions=("gaussian", "outliers", "channel-outliers"),
                    implementation: str | None = "xla", dtype: str = "bfloat16", causal: bool = True,
                    page_size: int | None = None, seed: int = 0) -> list[dict]:
    """What a quantized KV cache costs in accuracy: one row per (input distribution, cache dtype).

    q, k, v are drawn in float32 from ``attnlab.reference.inputs`` (every sequence full, S keys); the
    truth is float64 attention of those unquantized values. ``bf16_rel_err``: relative L2 error of
    ``decode_attention`` on q, K and V in ``dtype``; ``rel_err``: the same call on the ``dtype`` cache
    quantized as a server does (``quantize_kv_cache``, ``kv_scale`` layout; paged with ``page_size``).
    ``implementation``: the backend both calls run on (attnlab-decode for the kernel)."""

    lens = jnp.full((B,), S, jnp.int32)
    rows = []
    for dist in distributions:
        q, k, v = make_qkv(dist, B, T, S, N, K, H, "float32", seed=seed)
        ref = reference_decode_attention(q, k, v, np.asarray(lens), causal=causal)
        qd, kd, vd = (jnp.asarray(x).astype(dtype) for x in (q, k, v))
        call = dict(causal=causal, implementation=implementation)
        bf16 = rel_l2(np.asarray(decode_attention(qd, kd, vd, lens, **call), np.float64), ref)
        if page_size:
            kd, vd, call["page_table"] = to_pages(kd, vd, page_size)
        for name in kv_dtypes:
            (kc, ks), (vc, vs) = (quantize_kv_cache(x, name, kv_scale) for x in (kd, vd))
            out = decode_attention(qd, kc, vc, lens, k_scale=ks, v_scale=vs, **call)
            rows.append({"inputs": dist, "kv_dtype": canonical_kv_dtype(name), "kv_scale": kv_scale,
                         "rel_err": rel_l2(np.asarray(out, np.float64), ref), "bf16_rel_err": bf16})
    return rows
