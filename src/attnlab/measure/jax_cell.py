"""A cell of a JAX backend: its timed program compiled (or taken from the compile ahead), its output and gradients
checked, then timed (``compile_check_and_time``), on the inputs and call ``inputs.cell_inputs`` made once."""
from __future__ import annotations

import dataclasses

import jax

from ..core.records import Status
from ..reference.inputs import cotangent
from . import memory, timers
from .budget import compile_within_budget
from .check import check_into
from .inputs import functions
from .outcome import Skip, _short, classify


def compile_check_and_time(backend, cell, ins, opts, rec: dict, info, phases, ahead, cupti: bool) -> None:
    """A JAX cell on its inputs ``ins`` (``inputs.CellInputs``): compile its timed program (or take the one compiled
    ``ahead``), check its output and gradients, read the backend's facts and time it, all into ``rec``; raises
    ``Skip`` to end it early."""
    sets = ins.sets
    q0, k0, v0 = sets[0]
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
    if opts.check:
        with phases("check"):
            try:
                out = (compiled(*arg_sets[0]) if cell.mode == "fwd"     # paged cells: (q, pages, table)
                       else (fwd_ahead[0] if fwd_ahead else jax.jit(fwd))(q0, k0, v0))
                check_into(rec, out, sets[0], cell, backend, opts, ins.extras,
                           grads=None if cell.mode == "fwd" else lambda: compiled(*arg_sets[0]), ct=cts[0])
            except Skip:
                raise
            except Exception as e:  # noqa: BLE001
                raise Skip(*classify(e, "run"))
    try:
        facts = backend.facts(fwd, q0, k0, v0, fwd_as=lambda name: functions(dataclasses.replace(cell, backend=name),
                                                                            ins.extras)[0])
    except Exception as e:  # noqa: BLE001 - a fact that cannot be read is reported, not fatal
        facts = {"error": _short(f"{type(e).__name__}: {e}", 200)}
    rec.update({"facts": facts} if facts else {})
    rec["repeats"] = opts.repeats or (20 if info.platform == "gpu" else 5)
    with phases("timing"):
        try:
            timers.time_into(rec, compiled, arg_sets, opts, cupti=cupti)
        except Exception as e:  # noqa: BLE001
            raise Skip(*classify(e, "run"))
    rec["process_peak_bytes"] = memory.process_peak_bytes()
