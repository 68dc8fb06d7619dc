"""Quantized KV caches (FP8 e4m3 / e5m2, int8) with float32 scales, as vLLM lays them out.

A quantized cache is ``k_cache``/``v_cache`` stored in one of ``KV_DTYPES`` with ``k_scale``/``v_scale``
float32 arrays; the value a kernel attends is ``float32(stored) * scale``. The scale layouts, by the
cache's form (contiguous (B, S_max, K, H) or pages (P, page_size, K, H), ``attnlab.kernels.pages``):

    ``tensor``  ()                  one scale for the whole cache (vLLM's default ``k_scale``)
    ``head``    (K,)                one per KV head
    ``page``    (P, K)              one per (page, KV head): paged caches only
    ``token``   (B, S_max, K) or (P, page_size, K)   one per (token, KV head): the cache's shape without H

``quantize_kv_cache`` quantizes a float cache as servers do: the absolute maximum of each group of the
chosen granularity divided by the dtype's largest value (``QMAX``: 448 for e4m3, 57344 for e5m2, 127 for
int8), the values divided by it, int8 rounded to the nearest integer; an all-zero group gets scale 1.
``check_kv_scales`` is the one place a call's cache dtype and scales are checked (errors name the
argument and the rule); ``dequantize`` is the math the generic (masked) paths use; the float64 truths read a
cache with their own (``attnlab.reference.dequant64``), so a bug here cannot pass as right.
"""
from __future__ import annotations

import sys

import numpy as np

#: Quantized cache dtypes -> the largest finite value each stores (the scale's denominator).
QMAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0, "int8": 127.0}
KV_DTYPES = tuple(QMAX)
#: Short names a user or a sweep may give (``--kv-dtype fp8``); the cache dtype each means.
KV_DTYPE_ALIASES = {"fp8": "float8_e4m3fn", "e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
                    "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2", "int8": "int8"}
SCALE_LAYOUTS = ("tensor", "head", "page", "token")


def canonical_kv_dtype(name: str) -> str:
    """The cache dtype a name means (``fp8`` -> ``float8_e4m3fn``); ValueError naming the known ones."""
    n = str(name).lower()
    n = KV_DTYPE_ALIASES.get(n, n)
    if n not in QMAX:
        raise ValueError(f"kv cache dtype must be one of {', '.join(KV_DTYPES)} (or {', '.join(KV_DTYPE_ALIASES)}), "
                         f"got {name!r}")
    return n


def _dtype_name(x) -> str:
    import ml_dtypes  # heavy: ml_dtypes, on first use  # noqa: F401  (registers float8 names with NumPy)

    return np.dtype(x.dtype).name


def layout_shapes(cache_shape, paged: bool) -> dict[str, tuple[int, ...]]:
    """Scale layout -> the scale shape it has for a cache of ``cache_shape`` (rank 4)."""
    a, b, K, _ = (int(d) for d in cache_shape)
    shapes = {"tensor": (), "head": (K,), "token": (a, b, K)}
    if paged:
        shapes["page"] = (a, K)
    return shapes


def scale_layout(name: str, scale_shape, cache_shape, paged: bool) -> str:
    """The layout (``SCALE_LAYOUTS``) of a scale of ``scale_shape`` for this cache; ValueError listing the shapes."""
    shapes = layout_shapes(cache_shape, paged)
    for layout, shape in shapes.items():
        if tuple(int(d) for d in scale_shape) == shape:
            return layout
    form = "pages (P, page_size, K, H)" if paged else "contiguous (B, S_max, K, H)"
    listed = ", ".join(f"{lay} {s}" for lay, s in shapes.items())
    raise ValueError(f"{name} shape {tuple(scale_shape)} is not a scale layout of the {form} cache "
                     f"{tuple(int(d) for d in cache_shape)}: one of {listed}")


def check_kv_scales(k_cache, v_cache, k_scale, v_scale, *, paged: bool) -> tuple[str | None, str | None]:
    """(cache dtype, scale layout) of a quantized call, (None, None) of a float one; the rules:
    both scales or neither; a quantized cache (``KV_DTYPES``) needs them and scales need one; k_cache and
    v_cache share the dtype, the scales float32 and one layout (``scale_layout``)."""
    kd, vd = _dtype_name(k_cache), _dtype_name(v_cache)
    if (k_scale is None) != (v_scale is None):
        raise ValueError("k_scale and v_scale go together: give both (a quantized cache) or neither")
    if k_scale is None:
        for n, d in (("k_cache", kd), ("v_cache", vd)):
            if d in QMAX:
                raise TypeError(f"{n} has the quantized dtype {d}: give k_scale and v_scale "
                                f"(attnlab.quantize_kv_cache returns them)")
        return None, None
    for n, d in (("k_cache", kd), ("v_cache", vd)):
        if d not in QMAX:
            raise TypeError(f"{n} must have a quantized dtype ({', '.join(KV_DTYPES)}) when k_scale/v_scale are "
                            f"given, got {d}")
    if kd != vd:
        raise TypeError(f"k_cache and v_cache must share one quantized dtype, got {kd} and {vd}")
    layouts = []
    for n, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not hasattr(s, "shape") or not hasattr(s, "dtype"):
            raise TypeError(f"{n} must be a float32 array, got {type(s).__name__}")
        if _dtype_name(s) != "float32":
            raise TypeError(f"{n} must be float32, got {_dtype_name(s)}")
        layouts.append(scale_layout(n, s.shape, k_cache.shape, paged))
        if layouts[-1] in ("tensor", "head"):
            _check_shared_scale_values(n, s)
    if layouts[0] != layouts[1]:
        raise ValueError(f"k_scale and v_scale must share one layout, got {layouts[0]} and {layouts[1]}")
    return kd, layouts[0]


def _check_shared_scale_values(name: str, scale) -> None:
    """A concrete tensor or head scale must be finite: every token of a head is multiplied by it, so a NaN or inf
    makes the head's outputs NaN. (A token or page scale is not checked: a page or token past every length is
    never read and may hold anything; a traced or abstract scale has no values.)"""
    jax = sys.modules.get("jax")   # core imports no JAX (nor checks: checks -> problem -> kv_quant)
    if not hasattr(scale, "__array__") or (jax is not None and isinstance(scale, jax.core.Tracer)):
        return      # no values: traced, or a ShapeDtypeStruct (as explain takes)
    values = np.asarray(scale, np.float64).reshape(-1)     # () or (K,): a few numbers
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        where = "" if np.ndim(scale) == 0 else f" at KV head {int(bad[0])}"
        raise ValueError(f"{name} must be finite, got {values[bad[0]]}{where}")


def broadcast_scale(scale, layout: str, xp=np):
    """The scale shaped to multiply a rank-4 cache (..., K, H)."""
    s = xp.asarray(scale)
    if layout == "tensor":
        return s
    if layout == "head":
        return s[:, None]
    return s[:, None, :, None] if layout == "page" else s[..., None]


def dequantize(cache, scale, layout: str, dtype="float32", xp=np):
    """``cache`` (rank 4, quantized) as ``dtype``: float(stored) * scale (the scale in ``dtype`` too)."""
    return xp.asarray(cache).astype(dtype) * broadcast_scale(xp.asarray(scale).astype(dtype), layout, xp)


def dequantized_cache(cache, scale, layout: str, page_table=None, dtype="float32", xp=np):
    """(B, S_max, K, H) in ``dtype``: every sequence of a quantized cache dequantized (``xp``: ``jax.numpy`` keeps it
    on the device); a paged cache (P, page_size, K, H) is laid out through its ``page_table`` (B, pages_per_seq)."""
    x = dequantize(cache, scale, layout, dtype, xp)
    if page_table is None:
        return x
    table = xp.asarray(page_table)
    return x[table.reshape(-1)].reshape(table.shape[0], -1, *x.shape[2:])


_REDUCE = {"tensor": (0, 1, 2, 3), "head": (0, 1, 3), "page": (1, 3), "token": (3,)}


def quantize_kv_cache(cache, dtype: str = "float8_e4m3fn", granularity: str = "token"):
    """(quantized cache, float32 scale) of a float cache (B, S_max, K, H) or pages (P, page_size, K, H).

    ``dtype``: ``float8_e4m3fn``, ``float8_e5m2``, ``int8`` or a short name (``fp8``, ``e5m2``).
    ``granularity``: ``token`` (scale (B, S_max, K) / (P, page_size, K)), ``page`` (pages only: (P, K)),
    ``head`` ((K,)) or ``tensor`` (()). scale = absmax of the group / QMAX[dtype], at least float32's tiny (1 for
    an all-zero group);
    stored = value / scale, rounded to the nearest integer for int8, in range by construction.
    JAX in, JAX out (also under ``jax.jit``)."""
    import jax.numpy as jnp  # heavy: jax, core imports no JAX

    dtype = canonical_kv_dtype(dtype)
    if granularity not in _REDUCE:
        raise ValueError(f"granularity must be one of {', '.join(SCALE_LAYOUTS)}, got {granularity!r}")
    if len(getattr(cache, "shape", ())) != 4:
        raise ValueError(f"cache must have rank 4 (B, S_max, K, H) or (P, page_size, K, H), "
                         f"got shape {tuple(getattr(cache, 'shape', ()))}")
    x = jnp.asarray(cache).astype(jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=_REDUCE[granularity])
    # at least float32's smallest normal: a group of tiny values (amax < QMAX x 1.2e-38) gave scale 0, codes 0/0 = NaN
    tiny = jnp.finfo(jnp.float32).tiny
    scale = jnp.where(amax > 0, jnp.maximum(amax / QMAX[dtype], tiny), 1.0).astype(jnp.float32)
    y = x / broadcast_scale(scale, granularity, jnp)
    if dtype == "int8":
        y = jnp.round(y)
    y = jnp.clip(y, -QMAX[dtype], QMAX[dtype])       # rounding of the division may step past the largest value
    return y.astype(dtype), scale


def checked_cache(kv_dtype: str | None, kv_scale: str | None, page_size: int | None) -> str | None:
    """A problem's cache: its quantized dtype's canonical name, or None (a float cache, which has no ``kv_scale``);
    ValueError naming ``page_size`` unless it is None or an int >= 1, ``kv_scale`` when the layout is not one of
    ``SCALE_LAYOUTS`` (``page`` needs a page size) or is given without ``kv_dtype``."""
    if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, (int, np.integer))
                                  or page_size < 1):
        raise ValueError(f"page_size must be None or an int >= 1, got {page_size!r}")
    if kv_dtype is None:
        if kv_scale is not None:
            raise ValueError(f"kv_scale {kv_scale!r} needs kv_dtype (a float cache has no scales)")
        return None
    if kv_scale not in SCALE_LAYOUTS or (kv_scale == "page" and not page_size):
        raise ValueError(f"kv_scale must be one of {SCALE_LAYOUTS} with kv_dtype (page: with page_size), "
                         f"got {kv_scale!r}")
    return canonical_kv_dtype(kv_dtype)


def pages_read(first_keys, kv_lengths, page_size: int) -> int:
    """Pages of ``page_size`` keys a paged cache's requests read: request b's keys first_keys[b] .. kv_lengths[b] - 1
    (a window's first key, else 0) lie in (kv_lengths[b] - 1) // page_size - first_keys[b] // page_size + 1 pages
    (none when it reads no key): a ``page`` scale layout reads one scale per KV head of each."""
    first, end = (np.asarray(x, np.int64) for x in (first_keys, kv_lengths))
    return int(np.where(end > first, (end - 1) // page_size - first // page_size + 1, 0).sum())
