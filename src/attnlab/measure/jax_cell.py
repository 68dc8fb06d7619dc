"""A cell of a JAX backend: its timed program built (``functions``: the three mode builders, decode and sharded
cells included) and compiled (or taken from the compile ahead: ``compile_run``), then, once ``measure.cell`` has
checked its output and gradients (``JaxRun.output``, ``JaxRun.grads``), timed (``JaxRun.time``), on the inputs and
call ``inputs.cell_inputs`` made once."""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from .. import backends
from ..api import dot_product as api
from ..api.decode import decode_on
from ..core.records import Status
from ..kernels.pages import to_pages
from ..reference.inputs import cotangent
from . import memory, timers
from .budget import compile_within_budget
from .kv_cells import functions as quantized_functions
from .outcome import Skip, _short, classify


@dataclasses.dataclass(frozen=True)
class JaxRun:
    """A compiled JAX cell: ``fwd`` (q, k, v) -> out, ``compiled`` the timed program on each of ``arg_sets``,
    ``cts`` the cotangents of the sets (None for fwd cells), ``fwd_ahead`` the forward compiled ahead (if any)."""

    backend: object
    cell: object
    ins: object
    fwd: Callable
    compiled: Callable
    arg_sets: list
    cts: list
    fwd_ahead: list
    cupti: bool

    @property
    def ct(self):
        """The first set's output cotangent (None for a fwd cell)."""
        return self.cts[0]

    @property
    def grads(self):
        """None for a fwd cell, else a maker of the first set's gradients (the timed program itself)."""
        return None if self.cell.mode == "fwd" else lambda: self.compiled(*self.arg_sets[0])

    @property
    def caches(self):
        """A quantized-cache cell's timed caches of the first set (k_cache, k_scale, v_cache, v_scale[, page_table]:
        ``kv_cells.quantized_caches``), which its check reads; None for any other cell."""
        return self.arg_sets[0][1:] if self.cell.kv_dtype else None

    def output(self):
        """The forward output on the first input set (a paged cell's timed program takes (q, pages, table))."""
        if self.cell.mode == "fwd":
            return self.compiled(*self.arg_sets[0])
        return (self.fwd_ahead[0] if self.fwd_ahead else jax.jit(self.fwd))(*self.ins.sets[0])

    def time(self, opts, rec: dict, info, phases) -> None:
        """Read the backend's facts and time the compiled program on every set, into ``rec``; raises ``Skip``."""
        q0, k0, v0 = self.ins.sets[0]
        cell, extras = self.cell, self.ins.extras
        try:
            facts = self.backend.facts(self.fwd, q0, k0, v0, fwd_as=lambda name: functions(
                dataclasses.replace(cell, backend=name), backends.get(name), extras, self.ins.strategy)[0])
        except Exception as e:  # noqa: BLE001 - a fact that cannot be read is reported, not fatal
            facts = {"error": _short(f"{type(e).__name__}: {e}", 200)}
        rec.update({"facts": facts} if facts else {})
        time_program(rec, self.compiled, self.arg_sets, opts, info, phases, self.cupti)


def time_program(rec: dict, compiled, arg_sets: list, opts, info, phases, cupti: bool) -> None:
    """Time a compiled JAX program on every set of ``arg_sets`` into ``rec`` (phase ``timing``; ``timers.time_into``:
    CUPTI where ``cupti``), then the process's memory peak; raises ``Skip``. Every JAX cell's timing: a
    ``JaxRun``'s and a serving step's (``serving_cell.ServingRun``)."""
    rec["repeats"] = opts.repeats or (20 if info.platform == "gpu" else 5)
    with phases("timing"):
        try:
            timers.time_into(rec, compiled, arg_sets, opts, cupti=cupti)
        except Exception as e:  # noqa: BLE001
            raise Skip(*classify(e, "run")) from None
    rec["process_peak_bytes"] = memory.process_peak_bytes()


def compile_run(backend, cell, ins, opts, rec: dict, phases, ahead, cupti: bool) -> JaxRun:
    """A JAX cell on its inputs ``ins`` (``inputs.CellInputs``): its timed program's arguments made and the program
    compiled (or the one compiled ``ahead`` taken), its compile times and memory into ``rec``; raises ``Skip``
    (a compile failure, a peak above the device's memory)."""
    sets = ins.sets
    fwd, timed, make_args = functions(cell, backend, ins.extras, ins.strategy)
    with phases("inputs"):
        cts = [cotangent(opts.seed + 100 + i, q.shape) if cell.mode != "fwd" else None  # fwd: unused
               for i, (q, _, _) in enumerate(sets)]
        try:
            arg_sets = [make_args(q, k, v, ct) for (q, k, v), ct in zip(sets, cts)]
        except Exception as e:  # noqa: BLE001
            raise Skip(*classify(e, "compile"))
    with phases("compile", key="compile_wait_s"):
        try:
            compiled, lower_s, compile_s, *fwd_ahead = compile_within_budget(timed, arg_sets[0], opts.compile_budget_s, ahead)
        except Skip:
            raise
        except Exception as e:  # noqa: BLE001
            raise Skip(*classify(e, "compile"))
    rec.update(lower_s=lower_s, compile_s=lower_s + compile_s, compiled_ahead=ahead is not None)
    rec.update(memory.compiled_memory(compiled))
    if why := memory.over_limit(rec["peak_bytes"], opts.max_bytes):
        raise Skip(Status.OOM, why)
    return JaxRun(backend, cell, ins, fwd, compiled, arg_sets, cts, fwd_ahead, cupti)


def functions(cell, backend, extras: dict, strategy=None):
    """(forward fn(q, k, v), timed fn, a maker of its argument tuple from (q, k, v, ct)) of the cell on ``backend``
    (its ``Backend``, looked up once; a decode call runs on it, ``api.decode.decode_on``); ``extras``: the call's
    keyword arguments (``inputs.call_extras(cell)``); ``strategy``: a sharded cell's mesh strategy
    (``inputs.CellInputs.strategy``)."""
    kw = dict(is_causal=cell.causal, local_window_size=cell.window, implementation=cell.backend, **extras)

    if cell.lengths is not None:
        lens = jnp.asarray(cell.kv_lengths(), jnp.int32)
        if cell.kv_dtype:     # a quantized cache, made before timing (``kv_cells``)
            return quantized_functions(cell, lens, extras)
        sinks = kw.get("sinks")

        def decode(q, k, v, table=None):   # k, v: the caches (B, S, K, H), or their pages found through ``table``
            return decode_on(backend, q, k, v, lens, causal=cell.causal, page_table=table,
                             logits_soft_cap=cell.soft_cap, local_window_size=cell.window, sinks=sinks)

        if cell.lengths == "paged" and cell.mode == "fwd":
            # timed on pages made beforehand (shuffled, vLLM layout); checked as its contiguous twin (q, k, v)
            def fwd(q, k, v):
                return decode(q, *to_pages(k, v, cell.page_size))

            return fwd, decode, lambda q, k, v, ct: (q, *to_pages(k, v, cell.page_size))

        def fwd(q, k, v):
            return decode(q, k, v)
    elif cell.strategy is None:
        def fwd(q, k, v):
            return api.attention(q, k, v, **kw)
    elif strategy is None:
        raise ValueError(f"strategy: the sharded cell ({cell.strategy}) needs its strategy (inputs.cell_inputs looks "
                         f"it up)")
    else:
        fwd = strategy.build(strategy.mesh(cell.devices), cell.backend, cell.causal)

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
