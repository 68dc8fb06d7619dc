"""The serving plan's Mosaic GPU prefill slots (``ServingConfig(prefill_slots=P, prefill_chunk=C)``): which requests
take one, and why a call cannot run them. The run itself: ``kernels.serving_prefill_mgpu`` (read its docstring)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..core import device
from . import decode_mgpu_plan as mp


@dataclasses.dataclass(frozen=True)
class PrefillSlots:
    """The requests the Mosaic GPU prefill runs: ``slots`` (P, 4) int32, a row (request, q_start, q_len, kv_len) per
    slot (request B, lengths 0: an empty slot), ``chunk`` C."""

    slots: object
    chunk: int
    stream: int = 0          # ``ServingConfig.prefill_stream``: the CUDA stream they run on (0: the step's)


jax.tree_util.register_dataclass(PrefillSlots, data_fields=["slots"], meta_fields=["chunk", "stream"])


def take_slots(xp, q_len, kv_lengths, q_starts, cfg, max_q: int):
    """(``PrefillSlots``, taken (B,) bool) of ``cfg`` (a ``ServingConfig``): the first ``prefill_slots`` requests
    with decode_max_q < q_len <= ``prefill_chunk``; (None, None) without slots or where no request can prefill
    (``max_q``, a static bound on q_len). ``xp`` numpy or jax.numpy (traced lengths)."""
    slots, chunk = cfg.prefill_slots, cfg.prefill_chunk
    if not isinstance(slots, int) or slots < 0:
        raise ValueError(f"ServingConfig.prefill_slots must be an int >= 0, got {slots!r}")
    if slots and not (isinstance(chunk, int) and chunk > cfg.decode_max_q):
        raise ValueError(f"ServingConfig.prefill_chunk must be an int > decode_max_q={cfg.decode_max_q} with "
                         f"prefill_slots, got {chunk!r}")
    if not isinstance(cfg.prefill_stream, int) or cfg.prefill_stream < 0:
        raise ValueError(f"ServingConfig.prefill_stream must be an int >= 0, got {cfg.prefill_stream!r}")
    if not slots and (chunk is not None or cfg.prefill_stream):
        raise ValueError(f"ServingConfig.prefill_chunk={chunk!r} and prefill_stream={cfg.prefill_stream!r} do nothing "
                         "without prefill_slots > 0")
    if not slots or max_q <= cfg.decode_max_q:
        return None, None
    i32 = xp.int32
    B = q_len.shape[0]
    cand = (q_len > cfg.decode_max_q) & (q_len <= chunk)
    rank = xp.cumsum(cand.astype(i32)) - 1
    taken = cand & (rank < slots)
    at = xp.where(taken, rank, slots)                      # slot of each request, ``slots``: none
    if xp is np and not taken.any():                        # concrete lengths: no launch for no request
        return None, None
    if xp is np:
        req = np.full(slots + 1, B, np.int32)
        req[at] = np.arange(B, dtype=np.int32)
        req = req[:slots]
    else:
        req = jnp.full((slots,), B, i32).at[at].set(jnp.arange(B, dtype=i32), mode="drop")
    ok = req < B
    r = xp.minimum(req, B - 1)
    fields = (req, xp.where(ok, xp.asarray(q_starts)[r], 0), xp.where(ok, q_len[r], 0),
              xp.where(ok, xp.asarray(kv_lengths)[r], 0))
    return PrefillSlots(xp.stack([xp.asarray(f).astype(i32) for f in fields], axis=1), chunk=chunk,
                        stream=cfg.prefill_stream), taken


def unsupported(ps: PrefillSlots, *, kv_len_max: int, heads: int, kv_heads: int, head_dim: int, dtype,
                page_size, soft_cap, quantized: bool, interpret: bool) -> str | None:
    """Why the Mosaic GPU prefill cannot run this call, or None."""
    if quantized:
        return "Mosaic GPU prefill (ServingConfig.prefill_slots): a quantized cache runs on the Triton prefill class"
    why = mp.unsupported(ps.chunk, kv_len_max, heads, kv_heads, head_dim, str(dtype),
                         block_kv=mp.default_block_kv(kv_len_max),
                         compute_capability=None if interpret else device.current().compute_capability,
                         page_size=page_size, soft_cap=soft_cap)
    return None if why is None else f"Mosaic GPU prefill (ServingConfig.prefill_slots): {why}"
