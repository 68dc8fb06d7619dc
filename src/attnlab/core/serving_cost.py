"""The cost of a serving call (``attnlab.serving_attention``): FLOPs, bytes and the H200 roofline.

A serving call packs the new tokens of B requests: request b has q_len[b] = q_starts[b+1] - q_starts[b]
new tokens that attend causally to its kv_len[b] cached tokens (counting the new ones). Query i of
request b sits at position kv_len[b] - q_len[b] + i and sees the kv_len[b] - q_len[b] + i + 1 keys
at positions <= its own, so request b has

    pairs[b] = q_len[b] * (kv_len[b] - q_len[b]) + q_len[b] * (q_len[b] + 1) / 2

(query, key) pairs per query head. FLOPs = 4 * N * H * sum_b pairs[b] (QK^T and PV, 2 each), exactly
the valid work. Bytes = the valid K and V rows read once per KV head, 2 * sum_b kv_len[b] * K * H * itemsize,
plus q read and the output written for the valid tokens, 2 * sum_b q_len[b] * N * H * itemsize.
Padding tokens (past q_starts[B]) and cache slots past kv_len[b] cost nothing: a roofline of the
valid work, whatever shape the arrays are padded to.

A sliding window of left size L (``window_left``; ``local_window_size``'s left, the call being causal)
keeps only the keys at positions >= p - L for the query at p: it sees min(p, L) + 1 keys, so with
f(n) = sum_{p < n} (min(p, L) + 1) request b has pairs[b] = f(kv_len[b]) - f(kv_len[b] - q_len[b]),
and reads the kv_len[b] - max(0, kv_len[b] - q_len[b] - L) keys of its window: the roofline of the
window's bytes.
"""
from __future__ import annotations

import numpy as np

from . import kv_quant

#: The H200's HBM bandwidth (bytes/s) and dense bf16/fp16 tensor-core peak (FLOP/s).
H200_BANDWIDTH = 4.8e12
H200_PEAK_FLOPS = 989e12


def request_lengths(q_starts, kv_lengths) -> tuple[np.ndarray, np.ndarray]:
    """(q_len, kv_len) as int64 NumPy arrays from concrete ``q_starts`` (B+1,) and ``kv_lengths`` (B,)."""
    starts = np.asarray(q_starts).astype(np.int64)
    kv = np.asarray(kv_lengths).astype(np.int64)
    if starts.ndim != 1 or kv.shape != (starts.size - 1,):
        raise ValueError(f"q_starts must be (B+1,) and kv_lengths (B,), got {starts.shape} and {kv.shape}")
    return np.diff(starts), kv


def _window_prefix(n, left: int):
    """f(n) = sum over p < n of (min(p, left) + 1): the keys the first n positions see under the window."""
    n = np.maximum(n, 0)
    inside = np.minimum(n, left + 1)
    return inside * (inside + 1) // 2 + (n - inside) * (left + 1)


def causal_pairs(q_starts, kv_lengths, window_left: int | None = None) -> int:
    """sum_b of request b's visible (query, key) pairs per query head (see the module docstring)."""
    q, kv = request_lengths(q_starts, kv_lengths)
    if window_left is not None:
        return int(np.sum(_window_prefix(kv, int(window_left)) - _window_prefix(kv - q, int(window_left))))
    return int(np.sum(q * (kv - q) + q * (q + 1) // 2))


def keys_read(q_starts, kv_lengths, window_left: int | None = None) -> np.ndarray:
    """(B,) keys each request's queries see: kv_len[b], or its window's kv_len - max(0, kv_len - q_len - L); an idle
    slot (q_len 0) none."""
    q, kv = request_lengths(q_starts, kv_lengths)
    seen = kv if window_left is None else kv - np.maximum(kv - q - int(window_left), 0)
    return np.where(q > 0, seen, 0)


def serving_flops(q_starts, kv_lengths, heads: int, head_dim: int, window_left: int | None = None) -> float:
    """FLOPs of the valid work: 4 * N * H * causal_pairs."""
    return 4.0 * heads * head_dim * causal_pairs(q_starts, kv_lengths, window_left)


def serving_bytes(q_starts, kv_lengths, heads: int, kv_heads: int, head_dim: int, itemsize: int,
                  window_left: int | None = None, *, kv_itemsize: int | None = None,
                  kv_scale: str | None = None, page_size: int | None = None) -> float:
    """Bytes of the valid work: K and V of the keys seen (``keys_read``) once per KV head, q and out of the
    valid tokens. A quantized cache (``core.kv_quant``): K and V at ``kv_itemsize`` (1) bytes, plus their
    float32 scales read per key seen (``kv_scale="token"``), per page of them (``page``, with ``page_size``)
    or per KV head / once (``head``/``tensor``), as ``Problem.scale_bytes``."""
    q, n = request_lengths(q_starts, kv_lengths)
    kv = keys_read(q_starts, kv_lengths, window_left)
    kv_item = itemsize if kv_itemsize is None else kv_itemsize
    per_head = kv_quant.pages_read(n - kv, n, page_size) if kv_scale == "page" else int(kv.sum())
    scales = {None: 0, "tensor": 2 * 4, "head": 2 * 4 * kv_heads}.get(kv_scale, 2 * 4 * per_head * kv_heads)
    return float(2 * kv.sum() * kv_heads * head_dim * kv_item + scales + 2 * q.sum() * heads * head_dim * itemsize)


def serving_roofline_s(q_starts, kv_lengths, heads: int, kv_heads: int, head_dim: int, itemsize: int = 2, *,
                       bandwidth: float = H200_BANDWIDTH, peak_flops: float = H200_PEAK_FLOPS,
                       window_left: int | None = None, kv_itemsize: int | None = None,
                       kv_scale: str | None = None, page_size: int | None = None) -> float:
    """max(bytes / bandwidth, FLOPs / peak) in seconds (H200 defaults): the fastest the call can run
    (a window's: only its keys' bytes and pairs)."""
    return max(serving_bytes(q_starts, kv_lengths, heads, kv_heads, head_dim, itemsize, window_left,
                             kv_itemsize=kv_itemsize, kv_scale=kv_scale, page_size=page_size) / bandwidth,
               serving_flops(q_starts, kv_lengths, heads, head_dim, window_left) / peak_flops)
