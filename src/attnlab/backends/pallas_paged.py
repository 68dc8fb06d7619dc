"""``pallas-paged``: JAX's Pallas (Triton) ``paged_attention`` decode kernel, at T = 1, as a peer.

The kernel reads a paged cache: k/v pages (K, total_pages, page_size, H) and a block table
(B, pages_per_sequence). attnlab's caches are contiguous (B, S, K, H), so ``to_pages`` lays them
out as pages: sequence b's page i is page b * S/page_size + i. For K = 1 that is a free
reshape; for K > 1 it is a transpose that copies the whole cache.

What is timed: through ``attention(..., implementation="pallas-paged")`` (``run``) the
conversion is inside the call, so a sweep's kernel time includes that copy for K > 1 (it is
reported as is, not hidden). ``benchmarks/decode/tune.py`` times ``paged_call`` on pages made
beforehand (``to_pages``), which is the kernel alone: use those numbers for the comparison.

The kernel applies no logits scale, so q is multiplied by it first (in float32, then rounded
back to q's dtype: one extra rounding of q). T = 1 only; forward only; GPU only.
"""
from __future__ import annotations

import importlib
import warnings

import jax.numpy as jnp

from ..core.call import Call
from .base import Backend

PAGE_SIZE = 16
MODULE = "jax.experimental.pallas.ops.gpu.paged_attention"


def _module():
    with warnings.catch_warnings():  # deprecated in JAX 0.11 (still shipped)
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(MODULE)


def _largest_pow2_divisor(n: int, cap: int) -> int:
    d = 1
    while d * 2 <= cap and n % (d * 2) == 0:
        d *= 2
    return d


def launch_params(kv_len: int, page_size: int = PAGE_SIZE, k_splits: int = 16, pages_per_block: int = 8):
    """(k_splits, pages_per_compute_block) that the kernel accepts for S = kv_len (both must divide)."""
    pages = kv_len // page_size
    splits = _largest_pow2_divisor(pages, k_splits)
    per_partition = pages // splits
    return splits, _largest_pow2_divisor(per_partition, pages_per_block)


def to_pages(k, v, page_size: int = PAGE_SIZE):
    """Contiguous (B, S, K, H) caches -> (k_pages, v_pages, block_tables) for ``paged_attention``."""
    B, S, K, H = k.shape
    P = S // page_size

    def pages(x):
        x = x.reshape(B, P, page_size, K, H)
        return jnp.transpose(x, (3, 0, 1, 2, 4)).reshape(K, B * P, page_size, H)

    tables = (jnp.arange(B, dtype=jnp.int32)[:, None] * P + jnp.arange(P, dtype=jnp.int32)[None, :])
    return pages(k), pages(v), tables


def paged_call(q, k_pages, v_pages, block_tables, lengths, *, scale: float, k_splits: int, pages_per_block: int,
               block_h: int = 16, num_warps: int = 8, num_stages: int = 2):
    """q (B, 1, N, H) -> (B, 1, N, H) with JAX's paged_attention (q pre-scaled, see the docstring)."""
    B, _, N, H = q.shape
    qs = (q[:, 0].astype(jnp.float32) * scale).astype(q.dtype)
    out = _module().paged_attention(qs, k_pages, v_pages, block_tables, jnp.asarray(lengths, jnp.int32),
                                    block_h=block_h, pages_per_compute_block=pages_per_block, k_splits=k_splits,
                                    num_warps=num_warps, num_stages=num_stages)
    return out.reshape(B, 1, N, H)


class PallasPagedBackend(Backend):
    name = "pallas-paged"
    peer_parts = ("decode",)
    description = "jax.experimental.pallas.ops.gpu.paged_attention (Pallas Triton paged decode, T = 1)"
    forward_only = True
    page_size = PAGE_SIZE

    library = (MODULE, "cuda13")
    min_compute_capability = (8, 0)

    def supports(self, spec: Call) -> str | None:
        if spec.q_len != 1:
            return f"T={spec.q_len}: the paged decode kernel takes one query token per sequence (T = 1)"
        if spec.dtype not in ("float16", "bfloat16"):
            return f"dtype {spec.dtype} not supported (float16 or bfloat16)"
        H = spec.head_dim
        if H < 16 or H > 256 or H & (H - 1):
            return f"head dim {H} must be a power of two in [16, 256]"
        if spec.kv_len % self.page_size:
            return f"S={spec.kv_len} must be a multiple of the page size {self.page_size}"
        if spec.is_causal and spec.kv_len > 1:
            return "is_causal (top-left) at T=1 sees key 0 only; decode's rule needs no mask at T = 1"
        used = [n for n, on in (("bias", spec.bias_shape), ("mask", spec.mask_shape),
                                ("query_seq_lengths", spec.has_q_lengths), ("local_window_size", spec.window)) if on]
        if used:
            return f"takes no {', '.join(used)} (key_value_seq_lengths only)"
        return None

    def run(self, p: Call):
        k_pages, v_pages, tables = to_pages(p.key, p.value, self.page_size)
        lengths = jnp.full((p.batch,), p.kv_len, jnp.int32) if p.kv_lengths is None else p.kv_lengths
        splits, per_block = launch_params(p.kv_len, self.page_size)
        return paged_call(p.query, k_pages, v_pages, tables, lengths, scale=p.scale, k_splits=splits,
                          pages_per_block=per_block)
