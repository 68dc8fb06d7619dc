"""The float64 reference's matmuls, a block of keys at a time: query heads grouped by key/value head
(``_rows``), scores and P·V over blocks of ``KEY_BLOCK`` keys, never a whole long cache in float64."""
from __future__ import annotations

import numpy as np


def _round(x, low):
    return x if low is None else x.astype(low).astype(np.float64)


def _rows(x, K):
    """(B, T, N, H) -> (B, K, G*T, H): the G query heads of each key/value head as one row block
    (query head n = k*G + g reads key/value head k), so scores are one batched matmul per (b, k)."""
    B, T, N, H = x.shape
    return x.reshape(B, T, K, N // K, H).transpose(0, 2, 3, 1, 4).reshape(B, K, N // K * T, H)


def _unrows(x, T):
    """(B, K, G*T, H) -> (B, T, N, H), the inverse of ``_rows``."""
    B, K, GT, H = x.shape
    return x.reshape(B, K, GT // T, T, H).transpose(0, 3, 1, 2, 4).reshape(B, T, K * (GT // T), H)


#: Keys made float64 at a time: a long cache's K and V are never whole in float64 (3 GiB each at S=128k).
KEY_BLOCK = 4096


def _keys64(x, s, low):
    """Keys [s, s + KEY_BLOCK) of a (B, K, S, H) array as float64 (rounded to ``low`` when emulating)."""
    return _round(np.ascontiguousarray(x[:, :, s:s + KEY_BLOCK], np.float64), low)


def _scores(qr, kg, low):
    """qr (B, K, R, H) float64 @ kg (B, K, S, H)^T -> (B, K, R, S) float64, a block of keys at a time."""
    S = kg.shape[2]
    out = np.empty(qr.shape[:3] + (S,))
    for s in range(0, S, KEY_BLOCK):
        out[..., s:s + KEY_BLOCK] = qr @ _keys64(kg, s, low).transpose(0, 1, 3, 2)
    return out


def _pv(probs, vg, low):
    """probs (B, K, R, S) float64 @ vg (B, K, S, H) -> (B, K, R, H) float64, summed over blocks of keys."""
    out = np.zeros(probs.shape[:3] + (vg.shape[3],))
    for s in range(0, vg.shape[2], KEY_BLOCK):
        out += probs[..., s:s + KEY_BLOCK] @ _keys64(vg, s, low)
    return out
