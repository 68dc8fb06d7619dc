"""The next-steps step's memory probe: the compiled temp memory of an attention path, never allocated.

A program that cannot fit is predicted, not tried: its lowered program's largest tensor (read from
the StableHLO text, before anything is compiled) or its compiled memory estimate
(``memory_analysis()``, before anything runs) is compared with the device's memory, and the probe
is recorded ``oom`` with that statement. XLA is so never asked to allocate what cannot fit (on
the H200 the naive path at T = 32768 asked for 128 GiB and printed some 230 lines of errors).
"""
from __future__ import annotations

import os
import re

import jax

from .. import backends
from ..api import dot_product as api
from ..core.prepare import prepare
from ..measure.memory import compiled_memory, device_bytes_limit
from ..measure.outcome import classify

#: Overrides the device memory the probe compares with (bytes); tests set it tiny to force the prediction.
LIMIT_ENV = "ATTNLAB_DEVICE_MEMORY_BYTES"

_ITEMSIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "ui8": 1, "i1": 1,
             "f8E4M3FN": 1, "f8E5M2": 1}
_TENSOR = re.compile(r"tensor<((?:\d+x)+)([A-Za-z0-9]+)>")


def memory_limit() -> int | None:
    """Bytes the device can hold: ``ATTNLAB_DEVICE_MEMORY_BYTES`` where set, else the GPU allocator's
    limit; None where unknown (a CPU: the host's memory is not probed)."""
    if os.environ.get(LIMIT_ENV):
        return int(os.environ[LIMIT_ENV])

    return device_bytes_limit()


def largest_tensor(hlo_text: str) -> tuple[int, str]:
    """(bytes, type) of the largest tensor named in a StableHLO program's text: a lower bound of the
    memory the compiled program needs at once. (0, "") when it names none."""
    best = (0, "")
    for m in _TENSOR.finditer(hlo_text):
        dims, dtype = m.group(1)[:-1].split("x"), m.group(2)
        n = _ITEMSIZE.get(dtype, 4)
        for d in dims:
            n *= int(d)
        if n > best[0]:
            best = (n, f"{dtype}[{','.join(dims)}]")
    return best


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def compiled_temp(backend: str, batch: int, T: int, heads: int, head_dim: int, dtype: str) -> dict:
    """{status, reason, temp_bytes, peak_bytes} of ``backend``'s attention at (B, T, N, H), T = S,
    from XLA's compiled memory analysis; "oom" when predicted not to fit (nothing is allocated)."""

    shapes = [jax.ShapeDtypeStruct((batch, T, heads, head_dim), dtype) for _ in range(3)]
    why = backends.get(backend).why_not(prepare(*shapes).spec)
    if why:
        return {"status": "unsupported", "reason": f"{backend}: {why}", "temp_bytes": None, "peak_bytes": None}
    limit = memory_limit()
    try:
        lowered = jax.jit(lambda q, k, v: api.attention(q, k, v, implementation=backend)).lower(*shapes)
        big, what = largest_tensor(lowered.as_text())
        if limit and big > limit:
            return {"status": "oom", "temp_bytes": None, "peak_bytes": None, "estimate_bytes": big,
                    "reason": f"predicted, not compiled: the program holds a {what} tensor of {_gib(big)} > "
                              f"the device's {_gib(limit)}"}
        mem = compiled_memory(lowered.compile())
    except Exception as e:  # noqa: BLE001
        status, reason = classify(e, "compile")
        return {"status": status, "reason": reason, "temp_bytes": None, "peak_bytes": None}
    if limit and mem["peak_bytes"] and mem["peak_bytes"] > limit:
        return {"status": "oom", "temp_bytes": mem["temp_bytes"], "peak_bytes": mem["peak_bytes"],
                "estimate_bytes": mem["peak_bytes"],
                "reason": f"predicted, not run: the compiled program needs {_gib(mem['peak_bytes'])} > "
                          f"the device's {_gib(limit)}"}
    return {"status": "ok", "reason": None, **mem}
