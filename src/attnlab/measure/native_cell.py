"""A cell of a backend outside JAX (PyTorch): its whole output checked on the cell's inputs, then timed."""
from __future__ import annotations

import math

from ..core.prepare import prepare
from . import memory
from .check import check_output
from .inputs import call_extras
from .native import measure_native
from .outcome import Skip, Status, classify, rates


def _measure_native(backend, cell, spec, sets, opts, so_far: dict, info, phases) -> dict:
    """The record fields of the backend's whole output checked on the same inputs, then timed with the
    backend's own hook (CUPTI where it works, said in ``timer``); ``so_far``: the fields measured before
    (its ``flops`` and ``bytes`` are read). A failure raises ``Skip`` carrying the fields measured before it."""
    q0, k0, v0 = sets[0]
    scale = 1.0 / math.sqrt(cell.head_dim)
    decode = None
    if getattr(cell, "kv_dtype", None) and not backend.takes_kv_scales:
        raise Skip("unsupported", f"{cell.backend}: {backend.kv_scales_reason}")
    if cell.lengths is not None:
        why = (backend.supports(spec) or backend.decode_reason(cell.kv_lengths(), cell.q_len, cell.kv_len)
               or (backend.sinks_reason if spec.has_sinks and not backend.takes_sinks else None))
        if why:
            raise Skip(Status.UNSUPPORTED, f"{cell.backend}: {why}")
        decode = (cell.kv_lengths(), cell.causal)
    fields: dict = {}
    try:
        if opts.check:
            with phases("check"):
                if decode is None:
                    out = backend.run(prepare(q0, k0, v0, is_causal=cell.causal, local_window_size=cell.window,
                                              **call_extras(cell)))
                else:
                    out = backend.run_native_decode(q0, k0, v0, spec, scale, *decode)
                fields.update(check_output(out, sets[0], cell, backend, opts))
        fields["repeats"] = repeats = opts.repeats or 20
        with phases("timing"):
            fields.update(measure_native(backend, spec, scale, sets, repeats, opts.warmup, decode=decode))
        fields["process_peak_bytes"] = memory.process_peak_bytes()
    except Skip:
        raise
    except Exception as e:  # noqa: BLE001
        raise Skip(*classify(e, "run"), fields)
    return {**fields, **rates({**so_far, **fields}, cell, info, backend)}
