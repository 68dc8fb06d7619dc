"""On which inputs a cell runs: input sets, mesh placement and the call.

``cell_inputs`` makes a (non-serving) cell's inputs once: its (q, k, v) sets, the attention call of the first
(``attnlab.core.prepare.prepare``, the one call the backend is asked about and a native backend runs) and the
call's keyword arguments (``call_extras``), with the backend's refusals of the cell (a decode cell's:
``window_refusal``, ``paged_refusal``); ``jax_cell.functions`` builds what is timed from them.

Sharded cells get their mesh and input placement (and ``jax_cell`` their attention function) from the strategy
registry (``attnlab.core.strategies``), which the layer implementing the strategies fills (``attnlab.api.sharded``,
imported by ``attnlab.sweep``): measure looks a strategy up by name and imports no part of it.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..core import device, strategies
from ..core.call import Call
from ..core.prepare import prepare
from ..reference.inputs import cap_reach, draw_sets, inputs_draw, random_sinks
from . import peaks
from .outcome import Skip, Status, classify


@dataclasses.dataclass(frozen=True)
class CellInputs:
    """A (non-serving) cell's inputs, made once (``cell_inputs``): ``sets``, its (q, k, v) input sets (q (B, T, N, H),
    k and v (B, S, K, H), on the mesh for a sharded cell); ``call``, the attention call of the first set; ``extras``,
    the call's keyword arguments (``call_extras``: soft cap, segment ids, sinks); ``strategy``, a sharded cell's
    mesh strategy (``core.strategies``, looked up once), else None."""

    sets: list
    call: Call
    extras: dict
    strategy: object = None


def cell_inputs(cell, backend, opts, rec: dict, phases) -> CellInputs:
    """Draw the cell's input sets (phase ``inputs``) and its call's sinks, make its call once and ask ``backend``
    whether it runs it (every refusal of the cell: a native backend's of a decode cell too, ``native.NativeRun``);
    a sharded cell's sets go onto its mesh. Writes ``input_sets``, ``inputs_draw`` and ``mesh`` into ``rec``;
    raises ``Skip`` (unsupported: a refused call, a dtype JAX does not make, a mesh this machine lacks)."""
    w = cell.workload
    n = _set_count(w, opts, cell.devices)
    decode_why = None if cell.lengths is None else (   # read off the backend's declarations: no call needed
        window_refusal(backend, cell.window) or (paged_refusal(backend) if cell.lengths == "paged" else None))
    extras = call_extras(cell)       # the sinks, then the sets: one round of draws
    with phases("inputs"):
        try:
            sets = draw_sets(cell.inputs, w.batch, w.q_len, w.kv_len, w.heads, w.kv_heads, w.head_dim, w.dtype,
                             range(opts.seed, opts.seed + n))
        except Exception as e:  # noqa: BLE001
            raise Skip(*classify(e, "run"))
    if (f := cap_reach(cell.soft_cap)) != 1:
        sets = [(q * jnp.asarray(f, q.dtype), k, v) for q, k, v in sets]
    rec.update(input_sets=len(sets), inputs_draw=inputs_draw(cell.soft_cap))
    q0, k0, v0 = sets[0]
    if np.dtype(q0.dtype).name != cell.dtype:
        raise Skip(Status.UNSUPPORTED, f"dtype {cell.dtype}: JAX made {np.dtype(q0.dtype).name} inputs "
                                       f"(jax_enable_x64={jax.config.jax_enable_x64}); not run under a wrong label")
    call = prepare(q0, k0, v0, is_causal=cell.causal, local_window_size=cell.window, **extras)
    # decode cells: the backend's refusal comes from decode_attention itself when it is traced
    why = backend.why_not(call) if cell.lengths is None else backend.available() or decode_why
    why = why or backend.mode_reason(call, cell.mode)
    if not why and backend.native and cell.lengths is not None:   # a native kernel runs the decode cell itself
        why = (("no decode (cache) semantics" if not backend.decode else None)
               or (backend.kv_scales_reason if cell.kv_dtype and not backend.takes_kv_scales else None)
               or backend.supports(call) or backend.decode_reason(cell.kv_lengths(), cell.q_len, cell.kv_len)
               or (backend.sinks_reason if call.has_sinks and not backend.takes_sinks else None))
    if why:
        raise Skip(Status.UNSUPPORTED, f"{cell.backend}: {why}")
    st = None
    if cell.strategy is not None:
        if cell.devices > jax.device_count():
            raise Skip(Status.UNSUPPORTED, f"devices={cell.devices} asked, JAX sees {jax.device_count()} device(s)")
        devs = jax.devices()[: cell.devices]
        rec["mesh"] = {"devices": cell.devices, "axis": "x", "strategy": cell.strategy,
                       "kinds": sorted({d.device_kind for d in devs})}
        st = strategies.get(cell.strategy)
        if why_strategy := st.why_not(cell):     # before the inputs are placed: an axis it cannot split
            raise Skip(Status.UNSUPPORTED, why_strategy)
        sh = st.placement(st.mesh(cell.devices))   # timing excludes the initial scatter
        sets = [tuple(jax.device_put(x, sh) for x in s) for s in sets]
        call = dataclasses.replace(call, query=sets[0][0], key=sets[0][1], value=sets[0][2])   # 4-d: as prepare keeps them
    return CellInputs(sets, call, extras, st)


def paged_refusal(backend) -> str | None:
    """Why a sweep's paged cell does not time ``backend`` (it has no paged path of its own and would
    run on a gathered copy of the cache), or None."""
    if backend.paged:
        return None
    return "no paged KV cache path of its own (decode_attention would gather the pages into a contiguous copy)"


def window_refusal(backend, window) -> str | None:
    """Why a sweep's windowed decode cell does not time ``backend`` (its decode path takes no window: a native
    one would read the window top-left), or None."""
    return backend.decode_window_reason if window is not None and not backend.takes_decode_window else None


def _set_count(w, opts, devices: int = 1) -> int:
    """How many (q, k, v) sets of the problem ``w`` rotate past the L2 cache (``Options.input_sets``): each of a
    sharded cell's ``devices`` holds 1/devices of a set, and has an L2 of its own."""
    sheet = peaks.peak_for_kind(device.current().kind)
    return opts.input_sets((w.bytes("fwd") - w.batch * w.q_len * w.heads * w.head_dim * w.itemsize) / devices,
                           sheet and sheet.l2_bytes)


def call_extras(cell) -> dict:
    """``attention``'s keyword arguments for the cell's soft cap, packing and sinks (none when unset)."""
    kw = {}
    if cell.sinks:
        kw["sinks"] = jnp.asarray(random_sinks(cell.heads))
    if cell.soft_cap is not None:
        kw["logits_soft_cap"] = cell.soft_cap
    ids = cell.segment_ids() if cell.packing else None
    if ids is not None:
        kw["query_segment_ids"] = kw["key_value_segment_ids"] = ids   # concrete: compiled in, as a model's would be
    return kw
