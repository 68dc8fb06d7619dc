"""The float64 truths' own reading of a quantized KV cache: value = float(code) x scale.

Written apart from ``attnlab.core.kv_quant.dequantize``, which the masked paths run, so that a bug there (a
division for the product, a scale on the wrong axis) cannot make a path and its truth wrong alike. The scale's
layout is read off its rank alone: () one scale for the cache, (K,) one per KV head, (P, K) one per page and KV
head, (rows, keys, K) one per token; a cache is (rows, keys, K, H): (B, S_max, K, H) contiguous or
(P, page_size, K, H) pages.
"""
from __future__ import annotations

import numpy as np


def _times_scale(codes: np.ndarray, scale: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """codes (R, keys, K, H) float64 of the cache ``rows`` (R,), times their scale (the whole array's)."""
    if scale.ndim == 0:
        return codes * float(scale)
    if scale.ndim == 1:                                      # per KV head
        return np.einsum("rskh,k->rskh", codes, scale)
    if scale.ndim == 2:                                      # per page and KV head
        return np.einsum("rskh,rk->rskh", codes, scale[rows])
    return np.einsum("rskh,rsk->rskh", codes, scale[rows])   # per token


def dequantized_cache64(cache, scale) -> np.ndarray:
    """The whole cache (rows, keys, K, H) in float64."""
    codes = np.asarray(cache).astype(np.float64)
    return _times_scale(codes, np.asarray(scale, np.float64), np.arange(codes.shape[0]))


def dequantized_sequences64(cache, scale, seqs, page_table=None) -> np.ndarray:
    """(len(seqs), S_max, K, H) float64: the sequences ``seqs`` (batch indices) of a contiguous cache, or of a
    paged one through its ``page_table`` (B, pages_per_seq): sequence b is its pages table[b, 0], table[b, 1], ...
    end to end. Only those sequences' codes and scales leave the device."""
    seqs = np.asarray(seqs, np.int64)
    rows = seqs if page_table is None else np.asarray(page_table)[seqs].reshape(-1)
    codes = np.asarray(cache[rows]).astype(np.float64)          # indexed first: only these rows leave the device
    if len(np.shape(scale)) >= 2:       # per page or token: the rows read, in their order
        scale, at = scale[rows], np.arange(rows.size)
    else:
        at = rows
    out = _times_scale(codes, np.asarray(scale).astype(np.float64), at)
    return out.reshape(seqs.size, -1, *out.shape[2:])
