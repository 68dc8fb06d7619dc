"""A cell of a JAX backend: its timed program compiled (or taken from the compile ahead: ``compile_run``), then,
once ``measure.cell`` has checked its output and gradients (``JaxRun.output``, ``JaxRun.grads``), timed
(``JaxRun.time``), on the inputs and call ``inputs.cell_inputs`` made once."""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from ..core.records import Status
from ..reference.inputs import cotangent
from . import memory, timers
from .budget import compile_within_budget
from .inputs import functions
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
                dataclasses.replace(cell, backend=name), extras)[0])
        except Exception as e:  # noqa: BLE001 - a fact that cannot be read is reported, not fatal
            facts = {"error": _short(f"{type(e).__name__}: {e}", 200)}
        rec.update({"facts": facts} if facts else {})
        rec["repeats"] = opts.repeats or (20 if info.platform == "gpu" else 5)
        with phases("timing"):
            try:
                timers.time_into(rec, self.compiled, self.arg_sets, opts, cupti=self.cupti)
            except Exception as e:  # noqa: BLE001
                raise Skip(*classify(e, "run"))
        rec["process_peak_bytes"] = memory.process_peak_bytes()


def compile_run(backend, cell, ins, opts, rec: dict, phases, ahead, cupti: bool) -> JaxRun:
    """A JAX cell on its inputs ``ins`` (``inputs.CellInputs``): its timed program's arguments made and the program
    compiled (or the one compiled ``ahead`` taken), its compile times and memory into ``rec``; raises ``Skip``
    (a compile failure, a peak above the device's memory)."""
    sets = ins.sets
    fwd, timed, make_args = functions(cell, ins.extras)
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
    limit = opts.max_bytes or memory.device_bytes_limit()
    if limit and rec["peak_bytes"] and rec["peak_bytes"] > limit:
        raise Skip(Status.OOM, f"compiled peak {rec['peak_bytes']} bytes > device limit {limit} bytes; not run")
    return JaxRun(backend, cell, ins, fwd, compiled, arg_sets, cts, fwd_ahead, cupti)
