"""What a cell runs, on which inputs: input sets, mesh placement and the three mode builders.

Sharded cells get their mesh, input placement and attention function from the strategy registry
(``attnlab.core.strategies``), which the layer implementing the strategies fills (``attnlab.api.sharded``,
imported by ``attnlab.sweep``): measure looks a strategy up by name and imports no part of it.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import jax
import jax.numpy as jnp

from ..api import dot_product as api
from ..api.decode import decode_attention
from ..core import device, strategies
from ..kernels.pages import to_pages
from ..reference.distributions import make_qkv
from ..reference.inputs import random_qkv, random_sinks
from . import peaks
from .kv_cells import functions as quantized_functions
from .outcome import Skip, Status


def _input_sets(cell, opts):
    """As many (q, k, v) sets as rotate past the L2 cache (at most ``opts.max_input_sets``, 4 GiB)."""
    w = cell.workload
    one = w.bytes("fwd") - w.batch * w.q_len * w.heads * w.head_dim * w.itemsize  # q, k, v
    rotate = opts.rotate_bytes
    if rotate is None:
        p = peaks.peak_for_kind(device.current().kind)
        rotate = 3 * (p.l2_bytes if p else 64 * 2**20)
    n = max(1, min(opts.max_input_sets, math.ceil(rotate / max(one, 1)), max(1, (4 * 2**30) // max(one, 1))))
    return [_draw(getattr(cell, "inputs", "gaussian"), w, opts.seed + i) for i in range(n)]


#: The last non-gaussian draws (NumPy makes them on the host, ~1 s at T=16k): every backend of a
#: sweep measured on one (distribution, shape, seed) reuses them. Kept on the host (float32 NumPy),
#: so no device memory outlives its cell (a cell's memory figures and headroom stay its own).
_DRAWS: OrderedDict = OrderedDict()
_DRAWS_KEPT = 4


def _draw(dist: str, w, seed: int):
    """One (q, k, v) set as JAX arrays: q (B, T, N, H), k, v (B, S, K, H) in the cell's dtype, drawn from
    ``attnlab.reference.distributions``' ``dist``; ``gaussian`` is ``random_qkv`` itself (bit-identical to before)."""
    shape = (w.batch, w.q_len, w.kv_len, w.heads, w.kv_heads, w.head_dim)
    if dist == "gaussian":
        return random_qkv(*shape, w.dtype, seed=seed)
    key = (dist, shape, w.dtype, seed)
    if key not in _DRAWS:
        _DRAWS[key] = make_qkv(dist, *shape, "float32", seed=seed)
        while len(_DRAWS) > _DRAWS_KEPT:
            _DRAWS.popitem(last=False)
    _DRAWS.move_to_end(key)
    return tuple(jnp.asarray(a).astype(w.dtype) for a in _DRAWS[key])


def _place_sharded(sets, cell):
    """Put each input set on the mesh as the strategy splits it, so timing excludes the initial scatter."""
    st = strategies.get(cell.strategy)
    sh = st.placement(st.mesh(cell.devices))
    return [tuple(jax.device_put(x, sh) for x in s) for s in sets]


def _mesh_record(cell) -> dict:
    if cell.devices > jax.device_count():
        raise Skip(Status.UNSUPPORTED, f"{cell.devices} devices asked, JAX sees {jax.device_count()}")
    devs = jax.devices()[: cell.devices]
    return {"devices": cell.devices, "axis": "x", "strategy": cell.strategy, "kinds": sorted({d.device_kind for d in devs})}


def strategy_refusal(cell) -> str | None:
    """Why the cell's strategy cannot run it (None: it can, or the cell has no strategy)."""
    return None if cell.strategy is None else strategies.get(cell.strategy).why_not(cell.backend, cell.window)


def call_extras(cell) -> dict:
    """``attention``'s keyword arguments for the cell's soft cap, packing and sinks (none when unset)."""
    kw = {}
    if getattr(cell, "sinks", False):
        kw["sinks"] = jnp.asarray(random_sinks(cell.heads))
    if getattr(cell, "soft_cap", None) is not None:
        kw["logits_soft_cap"] = cell.soft_cap
    ids = cell.segment_ids() if getattr(cell, "packing", None) else None
    if ids is not None:
        kw["query_segment_ids"] = kw["key_value_segment_ids"] = ids   # concrete: compiled in, as a model's would be
    return kw


def _functions(cell):
    """(forward fn(q, k, v), timed fn, a maker of its argument tuple from (q, k, v, ct))."""
    kw = dict(is_causal=cell.causal, local_window_size=cell.window, implementation=cell.backend, **call_extras(cell))

    if cell.lengths is not None:
        lens = jnp.asarray(cell.kv_lengths(), jnp.int32)
        if getattr(cell, "kv_dtype", None):     # a quantized cache, made before timing (``kv_cells``)

            return quantized_functions(cell, lens)
        sinks = kw.get("sinks")

        def fwd(q, k, v):
            return decode_attention(q, k, v, lens, causal=cell.causal, implementation=cell.backend,
                                    logits_soft_cap=cell.soft_cap, local_window_size=cell.window, sinks=sinks)

        if cell.lengths == "paged" and cell.mode == "fwd":
            # timed on pages made beforehand (shuffled, vLLM layout); checked as its contiguous twin (q, k, v)
            def paged(q, k_pages, v_pages, table):
                return decode_attention(q, k_pages, v_pages, lens, causal=cell.causal, implementation=cell.backend,
                                        page_table=table, logits_soft_cap=cell.soft_cap,
                                        local_window_size=cell.window, sinks=sinks)

            def fwd(q, k, v):   # noqa: F811 - the paged call on pages made from (q, k, v)
                return paged(q, *to_pages(k, v, cell.page_size))

            return fwd, paged, lambda q, k, v, ct: (q, *to_pages(k, v, cell.page_size))
    elif cell.strategy is None:
        def fwd(q, k, v):
            return api.attention(q, k, v, **kw)
    else:
        st = strategies.get(cell.strategy)
        fwd = st.build(st.mesh(cell.devices), cell.backend, cell.causal)

    if cell.mode == "fwd":
        return fwd, fwd, lambda q, k, v, ct: (q, k, v)

    def loss(q, k, v, ct):
        return jnp.sum(fwd(q, k, v).astype(jnp.float32) * ct)

    if cell.mode == "fwd+bwd":
        return fwd, jax.grad(loss, argnums=(0, 1, 2)), lambda q, k, v, ct: (q, k, v, ct)

    treedef = []

    def make_bwd_args(q, k, v, ct):
        # The backward pass alone: residuals of the forward pass are the timed function's inputs.
        # Every input set reuses the first set's tree structure so one compilation serves all.
        _, vjp_fn = jax.vjp(fwd, q, k, v)
        leaves, tdef = jax.tree_util.tree_flatten(vjp_fn)
        treedef.append(tdef)
        return (jax.tree_util.tree_unflatten(treedef[0], leaves), ct.astype(q.dtype))

    return fwd, lambda vjp_fn, ct: vjp_fn(ct), make_bwd_args
