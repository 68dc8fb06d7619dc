"""The argument checks every call shares: ``attention``'s ``prepare`` (``attnlab.core.prepare``) and
``decode_attention``'s ``prepare_decode`` (``attnlab.api.decode``) validate through these, each
naming its own arguments (``query``/``key``/``value`` or ``q``/``k_cache``/``v_cache``).

Each rule is written once: the sizes of a call (every one >= 1, N a multiple of K; ``attention`` lets
B, T, S and N be 0, as jax.nn does) are the rules of ``attnlab.core.problem.Problem`` itself
(``call_problem`` builds the call's Problem and says a broken rule in the call's argument names);
dtypes (``common_float_dtype``), the key/value shapes against the query's (``check_kv_shapes``),
flags (``check_flag``), length arrays (``as_lengths``, ``length_values``), a bias or mask
(``broadcast_operand``), scale, soft cap, sinks and window have one helper each. Errors are ``ValueError``/``TypeError`` naming the argument
and the rule, raised before JAX sees the arrays; value checks are skipped for traced arrays.
"""
from __future__ import annotations

import math
import numbers
import sys
from typing import Any, Mapping, Sequence

import numpy as np

from .names import FLOAT_DTYPES
from .problem import SIZES, Problem, ProblemError


def _dtype_name(x) -> str:
    """The dtype JAX computes ``x`` in: a NumPy float64 array is float32 to JAX unless x64 is on."""
    name = np.dtype(x.dtype).name
    if name == "float64":
        import jax  # heavy: jax, core imports no JAX

        return np.dtype(jax.dtypes.canonicalize_dtype(x.dtype)).name
    return name


def _is_tracer(x) -> bool:
    jax = sys.modules.get("jax")   # no tracer exists before JAX is imported (and core stays JAX-free)
    return jax is not None and isinstance(x, jax.core.Tracer)


def _shape(name: str, x) -> tuple[int, ...]:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be an array with .shape and .dtype, got {type(x).__name__}")
    return tuple(int(d) for d in x.shape)


def call_problem(names: Mapping[str, str], sizes: Sequence[int], dtype: str, causal: bool,
                 window: tuple[int, int] | None = None, *, may_be_empty: Sequence[str] = ()) -> Problem | None:
    """The ``Problem`` of a call: ``sizes`` (B, T, S, N, K, H) read off its arrays' shapes.

    The rules are ``Problem.__post_init__``'s; a broken one is raised again as a ``ProblemError``
    (a ValueError) in the call's words, its cause the Problem's own error: ``names`` maps each size
    field to how the call names it (``{"heads": "q heads N", "kv_heads": "k_cache heads K", ...}``),
    e.g. ``q heads N=3 must be a multiple of k_cache heads K=2`` or ``head dim H=0 must be >= 1``.

    ``may_be_empty``: size fields that may be 0 (``attention``'s batch, q_len, kv_len and heads, as in
    jax.nn). When one is 0 the other rules are checked with it at 1 (heads: at K) and None is returned:
    an empty call has no Problem (the counts of one divide by its sizes); it runs no kernel."""
    got = dict(zip(SIZES, sizes))
    window = within_reach(window, got["q_len"] + got["kv_len"])
    empty = [f for f in may_be_empty if got[f] == 0]
    stand_in = {f: (got["kv_heads"] or 1) if f == "heads" else 1 for f in empty}   # N = 0: a multiple of any K
    try:
        problem = Problem(*(stand_in.get(f, got[f]) for f in SIZES), dtype, bool(causal), window)
    except ProblemError as e:
        if e.fields == ("heads", "kv_heads"):
            msg = f"{names['heads']}={got['heads']} must be a multiple of {names['kv_heads']}={got['kv_heads']}"
        elif len(e.fields) == 1 and e.fields[0] in names:
            msg = f"{names[e.fields[0]]}={got[e.fields[0]]} must be >= 1"
        else:
            raise
        raise ProblemError(msg, *e.fields) from e
    return None if empty else problem


def to_rank(x, ndim: int):
    """``x`` with unit axes prepended up to ``ndim`` dims (NumPy and JAX arrays alike)."""
    missing = ndim - len(x.shape)
    return x.reshape((1,) * missing + tuple(x.shape)) if missing > 0 else x


def broadcast_operand(name: str, x, target: tuple[int, int, int, int]):
    """A bias (floating) or mask (bool, True = attend) broadcastable to (B, N, T, S) ``target``, as 4-D
    (``to_rank``); None passes. ``name``: "bias" or "mask", which also says the dtype rule. As in jax.nn, a Python
    scalar or nested list is taken as an array, and an integer (or bool) bias is added as float32."""
    if x is None:
        return None
    if not hasattr(x, "dtype") and isinstance(x, (numbers.Real, list, tuple)):
        x = np.asarray(x)
    shape = _shape(name, x)
    dtype = np.dtype(x.dtype)
    if name == "mask" and dtype != np.dtype(bool):
        raise TypeError(f"mask must be bool (True = attend), got {dtype.name}; pass additive masks as bias")
    if name != "mask" and dtype.kind in "biu":
        x, dtype = x.astype(np.float32), np.dtype(np.float32)
    if name != "mask" and dtype.name not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have a floating dtype, got {dtype.name}")
    if len(shape) > 4:
        raise ValueError(f"{name} must have at most 4 dims broadcastable to (B, N, T, S)={target}, got shape {shape}")
    for letter, got, want in zip("BNTS", (1,) * (4 - len(shape)) + shape, target):
        if got not in (1, want):
            raise ValueError(f"{name} shape {shape} is not broadcastable to (B, N, T, S)={target}: "
                             f"dim {letter} is {got}, must be 1 or {want}")
    return to_rank(x, 4)


def check_kv_shapes(names: tuple[str, str, str], qs: tuple[int, ...], ks: tuple[int, ...], vs: tuple[int, ...]):
    """Key/value shapes against the query's, all of one rank (4: (B, ., ., H); 3: no batch): the value's
    equals the key's, and the key's batch size and head dim equal the query's. ``names``: (q, k, v)."""
    q, k, v = names
    if vs != ks:
        raise ValueError(f"{v} shape {vs} must equal {k} shape {ks}")
    if len(ks) == 4 and ks[0] != qs[0]:
        raise ValueError(f"{k} batch size {ks[0]} must equal {q}'s batch size B={qs[0]}")
    if ks[-1] != qs[-1]:
        raise ValueError(f"{k} head dim {ks[-1]} must equal {q}'s head dim H={qs[-1]}")


def check_flag(name: str, value) -> bool:
    """``value`` as a Python bool, as jax.nn reads a flag (``if is_causal``): a bool, an int, or a concrete 0-d
    bool/int array; TypeError naming ``name`` for anything else (a float, a str, a traced flag)."""
    if isinstance(value, (bool, np.bool_, numbers.Integral)):
        return bool(value)
    if (hasattr(value, "dtype") and tuple(getattr(value, "shape", (0,))) == () and not _is_tracer(value)
            and np.dtype(value.dtype).kind in "biu"):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def common_float_dtype(arrays: dict[str, Any]) -> str:
    """The one floating dtype name that ``arrays`` (argument name -> array) share; TypeError naming
    the argument whose dtype is not floating, or every dtype when they differ."""
    dts = {n: _dtype_name(x) for n, x in arrays.items()}
    for n, d in dts.items():
        if d not in FLOAT_DTYPES:
            raise TypeError(f"{n} must have a floating dtype ({', '.join(FLOAT_DTYPES)}), got {d}")
    if len(set(dts.values())) != 1:
        *first, last = dts
        raise TypeError(f"{', '.join(first)} and {last} must share one dtype, got "
                        + ", ".join(f"{n} {d}" for n, d in dts.items()))
    return next(iter(dts.values()))


def as_lengths(x):
    """A lengths argument as an array: a Python list or tuple (``[64, 20]``, which jax.nn takes) becomes a
    NumPy array (``length_values`` then checks its shape and integer dtype; the backends read it as
    int32; an empty list is B=0's lengths, not floats); arrays, traced ones included, and None pass as given."""
    if x is None or hasattr(x, "shape"):
        return x
    arr = np.asarray(x)
    return arr.astype(np.int32) if arr.size == 0 else arr


def length_values(name: str, x, batch: int, size: str = "B", why: str = ""):
    """Check a (B,) integer lengths array (``size``: its size's letters when not B, ``why``: what they count); its
    values (a NumPy array), or None when ``x`` is traced."""
    shape = _shape(name, x)
    if shape != (batch,):
        raise ValueError(f"{name} must have shape ({size},)=({batch},), got {shape}{why}")
    if np.dtype(x.dtype).kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {np.dtype(x.dtype).name}")
    return None if _is_tracer(x) else np.asarray(x)


def check_serving_lengths(starts, lengths, T_total: int, S: int) -> None:
    """A serving call's concrete q_starts (B+1,) and kv_lengths (B,): starts from 0, >= 0 tokens per request (0: an
    idle slot of a fixed-size batch, which reads nothing), each request's KV length in [its tokens, S_max], the last
    start within q's T_total tokens; ValueError naming which."""
    starts, lengths = (np.asarray(x).astype(np.int64) for x in (starts, lengths))
    B = lengths.size
    if starts[0] != 0:
        raise ValueError(f"q_starts[0]={int(starts[0])} must be 0")
    for b in range(B):
        n = int(starts[b + 1] - starts[b])
        if n < 0:
            raise ValueError(f"q_starts must not decrease: request {b} has q_starts[{b + 1}] - q_starts[{b}] = {n} < 0 "
                             "tokens")
        if not n <= lengths[b] <= S:
            raise ValueError(f"kv_lengths[{b}]={int(lengths[b])} must lie in [q_len, S_max]=[{n}, {S}] "
                             f"(it counts request {b}'s {n} new tokens)")
    if starts[B] > T_total:
        raise ValueError(f"q_starts[B]={int(starts[B])} must be <= q's token count T_total={T_total}")


def _check_lengths(name: str, x, batch: int, limit: int, letter: str):
    """A (B,) lengths array with values in [0, limit] (``letter``: T or S)."""
    vals = length_values(name, x, batch)
    if vals is not None and vals.size and (vals.min() < 0 or vals.max() > limit):
        raise ValueError(f"{name} values must lie in [0, {letter}]=[0, {limit}], got {vals.tolist()}")


def check_scale(scale):
    """None, a finite float (a Python float from any real; 0 and negative ones too, as jax.nn runs them), or a
    traced scalar as given. A NaN or infinite scale is refused: every logit, hence every row, would be NaN."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not (isinstance(scale, numbers.Real) or hasattr(scale, "dtype")):
        raise TypeError(f"scale must be a finite float or None, got {scale!r}")
    if math.prod(getattr(scale, "shape", ())) != 1:
        raise ValueError(f"scale must be a scalar (or an array of one value), got shape {tuple(scale.shape)}")
    scale = scale.reshape(()) if getattr(scale, "shape", ()) != () else scale     # jax.nn broadcasts (1,) too
    if _is_tracer(scale):
        return scale
    s = float(scale)
    if not math.isfinite(s):
        raise ValueError(f"scale must be finite, got {s}")
    return s


def check_soft_cap(cap) -> float | None:
    """None, or a positive finite Python/NumPy float (compiled in: it may not be traced)."""
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real) or _is_tracer(cap):
        raise TypeError(f"logits_soft_cap must be None or a positive finite float (a Python number, not an array), "
                        f"got {type(cap).__name__} {cap!r}")
    c = float(cap)
    if not (math.isfinite(c) and c > 0):
        raise ValueError(f"logits_soft_cap must be positive and finite (logits -> cap * tanh(logits / cap)), got {c}")
    return c


def check_sinks(sinks, heads: int, name: str = "sinks"):
    """None, or a (N,) floating array (one logit per query head: attention sinks) returned as given."""
    if sinks is None:
        return None
    shape = _shape(name, sinks)
    if shape != (heads,):
        raise ValueError(f"{name} must have shape (N,)=({heads},), one logit per query head, got {shape}")
    if np.dtype(sinks.dtype).name not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have a floating dtype ({', '.join(FLOAT_DTYPES)}), got {np.dtype(sinks.dtype).name}")
    if hasattr(sinks, "__array__") and not _is_tracer(sinks):   # concrete: a NaN or +inf logit makes every row
        # of its head NaN; -inf is no sink (a ShapeDtypeStruct, as ``explain`` takes, has no values)
        bad = np.flatnonzero(np.isnan(values := np.asarray(sinks, np.float64)) | (values == np.inf))
        if bad.size:
            raise ValueError(f"{name} must be finite logits (or -inf: no sink), got {values[bad[0]]} at head "
                             f"{int(bad[0])}")
    return sinks


def within_reach(window: tuple[int, int] | None, reach: int) -> tuple[int, int] | None:
    """``window`` (left, right) with each side capped at ``reach`` (T + S_max): no key lies farther than that from
    any query, so the cap changes no output, while a side near 2**31 (jax.nn's "no limit" idiom) would overflow
    the int32 positions every path adds it to and silently mask the wrong keys."""
    return None if window is None else (min(window[0], reach), min(window[1], reach))


def normalise_window(local_window_size) -> tuple[int, int] | None:
    """None, an int w (meaning (w, w)) or (left, right) with non-negative ints."""
    if local_window_size is None:
        return None
    def ok(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)
    if ok(local_window_size):
        w = int(local_window_size)
        if w < 0:
            raise ValueError(f"local_window_size must be >= 0, got {w}")
        return (w, w)
    if isinstance(local_window_size, (tuple, list)) and len(local_window_size) == 2 and all(map(ok, local_window_size)):
        left, right = (int(v) for v in local_window_size)
        if left < 0 or right < 0:
            raise ValueError(f"local_window_size (left, right) must both be >= 0, got {(left, right)}")
        return (left, right)
    raise ValueError(f"local_window_size must be None, an int or a (left, right) pair of ints, got {local_window_size!r}")
