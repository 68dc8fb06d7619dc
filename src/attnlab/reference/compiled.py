"""Reference programs compiled once per shape, without XLA's GPU autotuner, and shared across threads; the
references they compute, once per inputs.

``compiled_once(program, *args, **kw)`` runs a ``jax.jit`` program compiled for the shapes (and
shardings) of its arguments and its static options (``STATIC``); ``precompile(program, *shapes, **kw)``
compiles it from ``jax.ShapeDtypeStruct`` ahead of use (``attnlab.measure.prefetch`` does so in a
background thread). Each program is one future: a caller of a program another thread is compiling
waits for that compile instead of starting a second. ``computed_once((kind, inputs key), make)`` keeps what
``make()`` computed for the last ``RESULTS_KEPT`` inputs keys (``RESULTS_BYTES`` at most, the newest always), so
every backend and mode measured on the same inputs shares one reference.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future

import jax

#: Keyword arguments of the reference programs that are static (part of the compiled program).
STATIC = ("causal", "window", "tile", "budget", "soft_cap")

#: Compiled reference programs by (program, argument shapes and shardings, static options): futures, so a
#: program compiled ahead (``precompile``, in a background thread) is waited for, never compiled twice.
_PROGRAMS: OrderedDict = OrderedDict()
_PROGRAMS_KEPT = 64
_LOCK = threading.Lock()
#: A reference runs once per shape: XLA's GPU autotuner, which times GEMM algorithms while compiling
#: (seconds per program on the H200), buys it nothing. Without it the compile runs no kernel on the
#: device, so it may run beside a timed cell. The kernels under test keep their autotuning.
NO_AUTOTUNE = {"xla_gpu_autotune_level": 0}
#: References by inputs key, then kind: {"fwd": ..., "f64": ..., "grad": ...}.
_RESULTS: OrderedDict = OrderedDict()
RESULTS_KEPT = 8
RESULTS_BYTES = 2 * 2**30


def _sharding(x):
    """The part of an argument's placement a compiled program is bound to: None on one device (the
    default placement, which ``jax.ShapeDtypeStruct`` arguments of ``precompile`` also get)."""
    sh = getattr(x, "sharding", None)
    return None if sh is None or len(sh.device_set) == 1 else sh


def _key(program, args, kw):
    static = tuple(sorted((k, v) for k, v in kw.items() if k in STATIC))
    shape = lambda x: None if x is None else (tuple(x.shape), str(x.dtype), _sharding(x))  # noqa: E731
    dyn = tuple(sorted((k, shape(v)) for k, v in kw.items() if k not in STATIC))
    return (program.__name__, tuple(map(shape, args)), static, dyn)


def _compiled(program, args, kw):
    """The compiled ``program`` for these arguments' shapes (arrays or ``jax.ShapeDtypeStruct``)."""
    key = _key(program, args, kw)
    with _LOCK:
        fut = _PROGRAMS.get(key)
        mine = fut is None
        if mine:
            fut = _PROGRAMS[key] = Future()
            while len(_PROGRAMS) > _PROGRAMS_KEPT:
                _PROGRAMS.popitem(last=False)
        _PROGRAMS.move_to_end(key)
    if mine:
        try:
            fut.set_result(program.lower(*args, **kw).compile(compiler_options=NO_AUTOTUNE))
        except BaseException as e:  # noqa: BLE001 - raised to every caller of this program
            fut.set_exception(e)
            with _LOCK:
                _PROGRAMS.pop(key, None)
    return fut.result()


def compiled_once(program, *args, **kw):
    """``program(*args, **kw)``, compiled once per shape and static options without autotuning, and
    reused for every later call of that shape."""
    return _compiled(program, args, kw)(*args, **{k: v for k, v in kw.items() if k not in STATIC})


def precompile(program, *shapes, **kw) -> None:
    """Compile ``program`` for argument ``shapes`` (``jax.ShapeDtypeStruct``; keyword arguments too) so
    that a later ``compiled_once`` of arrays of those shapes finds it ready."""
    _compiled(program, shapes, kw)


def _nbytes(x) -> int:
    return sum(int(getattr(a, "nbytes", 0)) for a in jax.tree_util.tree_leaves(x))


def computed_once(key, make, parts: dict | None = None, name: str = ""):
    """``make()`` of ``key`` = (kind, inputs key), kept with the other kinds of the same inputs key; its wall
    seconds go to ``parts[name]`` when it runs (a reference found kept is not made)."""
    kind, rk = key
    entry = _RESULTS.setdefault(rk, {})
    _RESULTS.move_to_end(rk)
    if kind not in entry:
        t0 = time.perf_counter()
        entry[kind] = make()
        if parts is not None:
            parts[name] = round(time.perf_counter() - t0, 4)
        while len(_RESULTS) > 1 and (len(_RESULTS) > RESULTS_KEPT
                                     or sum(map(_nbytes, _RESULTS.values())) > RESULTS_BYTES):
            _RESULTS.popitem(last=False)
    return entry[kind]


def clear_results() -> None:
    """Forget every kept reference (``computed_once``)."""
    _RESULTS.clear()
