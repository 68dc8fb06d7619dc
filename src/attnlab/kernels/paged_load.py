"""The decode kernel's K/V block load, from a contiguous cache or through a page table (inside the kernel).

Contiguous: ``ref`` is one (batch, kv head)'s (S, H) cache; the block is rows start .. start+block_k-1.
Paged (vLLM layout, ``attnlab.kernels.pages``): ``ref`` is one kv head's pages flattened to
(P * page_size, H) (a free reshape of (P, page_size, K, H)) and ``table_ref`` the sequence's
(pages_per_seq,) page table. Both sizes are powers of two, so either
  * block_k <= page_size: the block lies inside one page: one table entry, then a contiguous load
    exactly like the contiguous cache's (measured on the H200 at page size 64, block_k 64: within
    0.5% of the contiguous kernel), or
  * block_k > page_size: a per-key gather: key position p reads row table[p // page_size] *
    page_size + p % page_size, a (block_k, H) load of the same shape and layout as the contiguous
    one (each page's rows contiguous). The first version gathered (pages, page_size, H) blocks and
    reshaped them: 1.8x the contiguous time at page size 16 on the H200; this form is unmeasured.
Keys at positions >= length are never loaded (masked), and table slots past the length are never
used as addresses (masked, then clamped into [0, P)), so a table padded with -1 is safe.
The table load makes the K/V load an indirect one, which Triton's pipeliner would prefetch only half
as far ahead; the kernel compiles a paged call with ``decode_plan.compiled_stages(stages, 1)``.
"""
from __future__ import annotations
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def load_kv_block(ref, *, start, kv_ok, length, block_k: int, page_size: int | None, table_ref=None):
    """(block_k, H) keys or values at positions start .. start+block_k-1; zeros where not kv_ok."""
    H = ref.shape[-1]
    mask = jnp.broadcast_to(kv_ok[:, None], (block_k, H))
    # Triton's lowering casts an int fill to a float8 block not at all (a float fill it does)
    zero = 0.0 if jnp.issubdtype(ref.dtype, jnp.floating) and jnp.dtype(ref.dtype).itemsize == 1 else 0
    if page_size is None:
        return plgpu.load(ref.at[pl.ds(start, block_k), :], mask=mask, other=zero)
    last_page = ref.shape[0] // page_size - 1
    if block_k <= page_size:
        page = jnp.clip(table_ref[lax.div(start, page_size)], 0, last_page)   # start < length: a used slot
        first_row = pl.multiple_of(page * page_size + lax.rem(start, page_size), block_k)
        return plgpu.load(ref.at[pl.ds(first_row, block_k), :], mask=mask, other=zero)
    pos = start + lax.iota(jnp.int32, block_k)
    # every index an array (Pallas interpret mode loads either all slices or all arrays)
    pages = plgpu.load(table_ref.at[lax.div(pos, page_size)], mask=kv_ok, other=0)
    rows = jnp.clip(jnp.where(kv_ok, pages, 0), 0, last_page) * page_size + lax.rem(pos, page_size)
    return plgpu.load(ref.at[rows[:, None], lax.iota(jnp.int32, H)[None, :]], mask=mask, other=zero)

