"""The decode kernel's K/V block load, from a contiguous cache or through a page table (inside the kernel).

Contiguous: ``ref`` is one (batch, kv head)'s (S, H) cache; the block is rows start .. start+block_k-1.
Paged (vLLM layout, ``attnlab.kernels.pages``): ``ref`` is one kv head's (P, page_size, H) pages
and ``table_ref`` the sequence's (pages_per_seq,) page table. Both sizes are powers of two, so
either the block lies inside one page (block_k <= page_size: one table entry, a contiguous load)
or it covers block_k / page_size whole pages (a gather of whole pages, each contiguous).
Keys at positions >= length are never loaded (masked), and table slots past the length are
never used as addresses (replaced by page 0, and masked), so a table padded with -1 is safe.
"""
from __future__ import annotations


def load_kv_block(ref, *, start, kv_ok, length, block_k: int, page_size: int | None, table_ref=None):
    """(block_k, H) keys or values at positions start .. start+block_k-1; zeros where not kv_ok."""
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    H = ref.shape[-1]
    if page_size is None:
        mask = jnp.broadcast_to(kv_ok[:, None], (block_k, H))
        return plgpu.load(ref.at[pl.ds(start, block_k), :], mask=mask, other=0)
    last_page = ref.shape[0] - 1
    if block_k <= page_size:
        page = jnp.clip(table_ref[lax.div(start, page_size)], 0, last_page)   # start < length: a used slot
        mask = jnp.broadcast_to(kv_ok[:, None], (block_k, H))
        return plgpu.load(ref.at[page, pl.ds(lax.rem(start, page_size), block_k), :], mask=mask, other=0)
    n_pages = block_k // page_size
    first = lax.div(start, page_size)
    slot_ok = (first + lax.iota(jnp.int32, n_pages)) * page_size < length
    pages = plgpu.load(table_ref.at[pl.ds(first, n_pages)], mask=slot_ok, other=0)
    pages = jnp.clip(jnp.where(slot_ok, pages, 0), 0, last_page)
    mask = jnp.broadcast_to(kv_ok.reshape(n_pages, page_size)[:, :, None], (n_pages, page_size, H))
    # every index an array (Pallas interpret mode loads either all slices or all arrays)
    idx = (pages[:, None, None], lax.iota(jnp.int32, page_size)[None, :, None], lax.iota(jnp.int32, H)[None, None, :])
    return plgpu.load(ref.at[idx], mask=mask, other=0).reshape(block_k, H)
