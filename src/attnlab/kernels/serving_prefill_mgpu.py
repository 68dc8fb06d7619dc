"""A serving step's prefill chunks on the Mosaic GPU (wgmma) kernel: ``ServingConfig(prefill_slots=P, prefill_chunk=C)``.

Why: the serving kernel's prefill tiles are Triton's (``mma.sync``), 25-37% of the H200's bf16 peak on mixed
batches (results/gpu-2026-12-04-serving-2), where the Mosaic GPU decode kernel (``kernels.decode_mgpu``:
FlashAttention-3's warp-specialised structure, wgmma and TMA) reaches 53-63% on its compute-bound shapes.

What: the plan (``serving_plan.make_serving_plan``) gives up to P requests with decode_max_q < q_len <= C (the
first P in request order) a *slot*; its prefill class leaves them out (requests longer than C, or past the P-th,
stay there: nothing is dropped). The slots run as one padded call of ``decode_attention_mgpu``:
q (P, C, N, H) with request b's q_len tokens at the end of its slot, so query t sits at position kv_len - C + t
(the kernel's causal rule; its row tiles read only up to their last token's key, ``program_blocks``, and a tile
of the slot's padding only reads no key: ``q_first``), the
caches read through a page table (a contiguous cache viewed as pages of block_kv keys: a reshape, no copy; a
paged cache's own table rows). The step's output starts as these rows: each token of a slot's q_len reads its
row, every other token is 0 (a gather through a (T_total,) index: an XLA scatter of the rows cost 0.14-0.24 ms on
the H200, results/gpu-2026-12-06-prefill-slots); the slot's padding rows and empty slots (request index B,
lengths 0) are read by no token. The Triton classes then write their own requests' rows into it.

With ``ServingConfig(prefill_stream=n)`` the slots run on CUDA stream n (``on_stream``: XLA's stream annotation, an
async call the step waits for) into their own zeros, and the Triton classes write theirs into another on the step's
stream at the same time; the two are added (each row is 0 in one of them).

Static sizes: P and C (the caller's promise on the chunk size, e.g. a server's chunked-prefill budget), so
the traced lengths only fill the slots. Runs what ``decode_mgpu_plan.unsupported`` allows (sm_90, bf16/fp16,
H in {64, 128}, no soft cap) on caches in q's dtype; otherwise the call raises, naming the reason.
"""
from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
from jax.experimental.compute_on import compute_on

from . import decode_mgpu as dm
from .decode_mgpu_plan import default_block_kv
from .serving_slots import PrefillSlots


def run(q, k, v, page_table, ps: PrefillSlots, *, scale: float, sinks, window_left, interpret: bool):
    """(T_total, N, H) in q's dtype: the slots' tokens' rows, 0 elsewhere. q (T_total, N, H); k, v (B, S, K, H), or
    pages (n_pages, page_size, K, H) with ``page_table`` (B, pages); ``sinks`` (N,) natural-log logits or None."""
    if interpret and isinstance(q, jax.core.Tracer):
        raise NotImplementedError("Mosaic GPU prefill slots in JAX's GPU interpreter (no GPU) run eagerly only: "
                                  "the interpreter hangs under jax.jit")
    T_total, N, H = (int(d) for d in q.shape)
    C, P = ps.chunk, int(ps.slots.shape[0])
    req, q_start, q_len, kv_len = (ps.slots[:, i] for i in range(4))
    if page_table is None:       # a contiguous cache as pages of block_kv keys: request b's page j is b * S / bkv + j
        B, S, K, _ = (int(d) for d in k.shape)
        bkv = default_block_kv(S)
        k, v = (x.reshape(B * S // bkv, bkv, K, H) for x in (k, v))
        per = S // bkv
        table = jnp.minimum(req, B - 1)[:, None] * per + jnp.arange(per, dtype=jnp.int32)[None, :]
    else:
        B = int(page_table.shape[0])
        table = jnp.asarray(page_table, jnp.int32)[jnp.minimum(req, B - 1)]
    t = jnp.arange(C, dtype=jnp.int32)[None, :]
    pad = C - q_len[:, None]                                  # the slot's first rows are padding
    valid = (t >= pad) & (req[:, None] < B)
    src = jnp.clip(q_start[:, None] + t - pad, 0, T_total - 1)
    qs = jnp.where(valid[..., None, None], q[src], 0).astype(q.dtype)          # (P, C, N, H)
    window = None if window_left is None else (int(window_left), 0)
    rows = dm.decode_attention_mgpu(qs, k, v, kv_len, causal=True, scale=scale, page_table=table, sinks=sinks,
                                    window=window, q_first=pad[:, 0],
                                    interpret=dm.gpu_interpreter() if interpret else False)
    dest = jnp.where(valid, q_start[:, None] + t - pad, T_total)               # padding rows: no token
    row_of = jnp.full((T_total + 1,), -1, jnp.int32).at[dest.reshape(P * C)].set(
        jnp.arange(P * C, dtype=jnp.int32))[:T_total]                         # each token's slot row, or -1
    gathered = rows.reshape(P * C, N, H)[jnp.maximum(row_of, 0)]
    return jnp.where((row_of >= 0)[:, None, None], gathered, 0).astype(q.dtype)


def on_stream(fn, stream: int):
    """``fn`` to run on CUDA stream ``stream`` (> 0) when called inside a jitted step: XLA wraps the call in an
    async call-start/call-done pair, so the step's other kernels can run while it does (``compute_on``'s
    ``gpu_stream:n``; other platforms lower the annotation and ignore it). JAX >= 0.11's ``compute_on`` transforms
    a function (outputs in device memory); JAX 0.10's is a context manager around a jitted call."""
    compute_type = f"gpu_stream:{int(stream)}"
    if "out_memory_spaces" in inspect.signature(compute_on).parameters:
        return compute_on(fn, compute_type=compute_type, out_memory_spaces=jax.memory.Space.Device)
    jitted = jax.jit(fn)

    @functools.wraps(fn)
    def call(*args):
        with compute_on(compute_type):
            return jitted(*args)
    return call
