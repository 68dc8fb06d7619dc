"""Paged KV caches (vLLM's layout) for decode: make pages, read them back, check a page table.

Layout
    k_pages, v_pages  (P, page_size, K, H): P physical pages of page_size tokens each.
    page_table        (B, pages_per_seq) int32: sequence b's logical page i (tokens
                      i*page_size .. (i+1)*page_size - 1) lives in physical page page_table[b, i].
    A sequence of length L uses its first ceil(L / page_size) slots; the slots past them are
    never read (they may hold anything, e.g. -1). S_max = pages_per_seq * page_size.

A paged call is the same computation as its contiguous twin ``gather_pages``: the references and
checks judge a paged output against the float64 reference of the gathered cache.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.core import Tracer


def pages_in_use(lengths, page_size: int) -> np.ndarray:
    """(B,) ceil(lengths / page_size): the slots of each sequence's table that are read."""
    return -(-np.asarray(lengths).astype(np.int64) // int(page_size))


def to_pages(k, v, page_size: int, *, seed: int | None = 0):
    """Contiguous caches (B, S, K, H) -> (k_pages, v_pages, page_table) in vLLM's layout.

    S must be a multiple of ``page_size``. P = B * S / page_size pages; with ``seed`` the pages
    are placed in a random order (a fixed permutation, so the table is a real indirection), with
    None in order (sequence b's page i is page b * S/page_size + i). Works on jax and numpy arrays.
    """
    B, S, K, H = (int(d) for d in k.shape)
    if page_size < 1 or S % page_size:
        raise ValueError(f"page_size must divide S={S}, got {page_size}")
    per_seq = S // page_size
    order = np.arange(B * per_seq) if seed is None else np.random.default_rng(seed).permutation(B * per_seq)
    table = np.empty(B * per_seq, np.int32)
    table[order] = np.arange(B * per_seq, dtype=np.int32)      # logical page order[j] sits in physical page j

    def pages(x):                                              # physical page j holds logical page order[j]
        flat = x.reshape(B * per_seq, page_size, K, H)
        return flat[order] if isinstance(x, np.ndarray) else flat[jnp.asarray(order)]

    return pages(k), pages(v), table.reshape(B, per_seq)


def gather_pages(pages, page_table, lengths=None):
    """(P, page_size, K, H) pages + (B, pages_per_seq) table -> contiguous (B, S_max, K, H).

    Slots past ``ceil(lengths[b] / page_size)`` (when lengths are given) read page 0 instead of
    whatever the table holds there, so a table padded with -1 still gathers; their keys are
    past the length and never attended. Works on jax (also traced) and numpy arrays.
    """
    host = all(isinstance(x, (np.ndarray, list, tuple)) or x is None for x in (pages, page_table, lengths))
    xp = np if host else jnp      # NumPy pages beside a jax table or traced lengths: jnp
    P, ps, K, H = (int(d) for d in pages.shape)
    B, per_seq = (int(d) for d in page_table.shape)
    table = xp.asarray(page_table).astype(xp.int32)
    if lengths is not None:
        used = -(-xp.asarray(lengths).astype(xp.int32) // ps)
        table = xp.where(xp.arange(per_seq)[None, :] < used[:, None], table, 0)
    table = xp.clip(table, 0, P - 1)
    return xp.asarray(pages)[table].reshape(B, per_seq * ps, K, H)


def page_table_errors(page_table, lengths, num_pages: int, page_size: int) -> str | None:
    """Why a concrete ``page_table`` cannot serve ``lengths`` (a used slot outside [0, P)), or None."""
    table = np.asarray(page_table)
    used = pages_in_use(lengths, page_size)
    for b, n in enumerate(used.tolist()):
        row = table[b, :n]
        bad = np.flatnonzero((row < 0) | (row >= num_pages))
        if bad.size:
            i = int(bad[0])
            return (f"page_table[{b}, {i}]={int(row[i])} is not a page index in [0, {num_pages}) "
                    f"(slot {i} holds keys of kv_lengths[{b}]={int(np.asarray(lengths)[b])})")
    return None


def validate_paged(k_pages, v_pages, page_table, kv_lengths, *, batch: int, q_len: int) -> tuple[int, int]:
    """Check a paged call's cache arguments; return (page_size, S_max). Errors name the argument (k_cache, v_cache:
    the API's names for the pages) and the rule.

    k_pages, v_pages (P, page_size, K, H); page_table (B, pages_per_seq) int; the used slots of a
    concrete table must be page indices in [0, P) (``page_table_errors``); traced tables are not
    checked (the kernel clamps every index into [0, P) and never reads past a length).
    """
    ks = tuple(int(d) for d in k_pages.shape)
    if len(ks) != 4:
        raise ValueError(f"k_cache must have rank 4 (P, page_size, K, H) with page_table, got shape {ks}")
    if tuple(int(d) for d in v_pages.shape) != ks:
        raise ValueError(f"v_cache shape {tuple(v_pages.shape)} must equal k_cache shape {ks}")
    if not hasattr(page_table, "shape") or not hasattr(page_table, "dtype"):
        page_table = np.asarray(page_table)
    ts = tuple(int(d) for d in page_table.shape)
    if len(ts) != 2 or ts[0] != batch or ts[1] < 1:
        raise ValueError(f"page_table must have shape (B, pages_per_seq) = ({batch}, >= 1), got {ts}")
    if np.dtype(page_table.dtype).kind not in "iu":
        raise TypeError(f"page_table must be an integer array (int32), got dtype {np.dtype(page_table.dtype).name}")
    P, page_size = ks[0], ks[1]
    if P < 1 or page_size < 1:
        raise ValueError(f"k_cache needs >= 1 page of >= 1 token, got shape {ks}")
    S = ts[1] * page_size

    if not isinstance(page_table, Tracer) and not isinstance(kv_lengths, Tracer):
        lens = np.asarray(kv_lengths)
        if lens.shape == (batch,) and np.all(lens <= S):
            why = page_table_errors(page_table, lens, P, page_size)
            if why:
                raise ValueError(why)
    return page_size, S
