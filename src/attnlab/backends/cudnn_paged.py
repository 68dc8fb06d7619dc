"""cuDNN's paged attention (JAX's private ``jax._src.cudnn.fused_attention_stablehlo.paged_attention``) for decode.

``decode_attention(q, k_pages, v_pages, kv_lengths, page_table=..., implementation="cudnn")`` runs
here: cuDNN reads the pages (P, page_size, K, H), vLLM's layout, through the table itself (passed
as both page_table_k and page_table_v, shape (B, 1, pages_per_seq, 1)). q_seqlen = T,
kv_seqlen = kv_lengths with the PADDING mask; for T > 1 with causal the decode rule's (B, 1, T, S)
mask goes in as ``mask`` (JAX makes it a bias). JAX's cuDNN layer asks for exactly
B * pages_per_seq pages (``check_layout``): other counts are refused with that rule.
Private API (JAX 0.10.2 and 0.11.2 have this signature): ``paged_reason`` says when it is missing.
"""
from __future__ import annotations

import importlib

import jax.numpy as jnp

from ..core.errors import UnsupportedError

MODULE = "jax._src.cudnn.fused_attention_stablehlo"


def _module():
    return importlib.import_module(MODULE)


def paged_reason(spec, num_pages: int, pages_per_seq: int) -> str | None:
    """Why cuDNN's paged attention cannot run this decode (decode ``Call``), or None."""
    try:
        mod = _module()
    except ImportError as e:
        return f"{MODULE} not importable ({e})"
    if not hasattr(mod, "paged_attention"):
        return f"{MODULE}.paged_attention missing in this JAX"
    if spec.dtype not in ("float16", "bfloat16"):
        return f"dtype {spec.dtype} not supported (float16 or bfloat16)"
    if not spec.scale_is_static:
        return "scale is traced (pass a Python float)"
    if num_pages != spec.batch * pages_per_seq:
        return (f"cuDNN's paged attention needs exactly B * pages_per_seq = {spec.batch * pages_per_seq} pages, "
                f"got {num_pages}")
    return None


def run_paged_decode(backend, d, mask):
    """A decode ``Call`` with a page table, on cuDNN's paged attention; (B, T, N, H)."""
    P = int(d.k_cache.shape[0])
    why = backend.available() or paged_reason(d, P, int(d.page_table.shape[1]))
    if why:
        raise UnsupportedError(backend.name, why)
    mod = _module()
    table = d.page_table.astype(jnp.int32)[:, None, :, None]
    q_len = jnp.full((d.batch,), d.q_len, jnp.int32)
    return mod.paged_attention(d.query, d.k_cache, d.v_cache, q_len, d.kv_lengths, table, table, None, mask,
                               scale=float(d.scale), mask_type=mod.MaskType.PADDING, qkv_layout="BTNH")
