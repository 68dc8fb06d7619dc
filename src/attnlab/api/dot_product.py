"""The public entry point: ``attention``, a drop-in superset of ``jax.nn.dot_product_attention``.

Shape letters (B, T, S, N, K, H) are explained in ``attnlab.core.prepare``.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import textwrap

import jax
import jax.numpy as jnp
import jaxlib

from .. import backends
from ..backends.base import query_keep
from ..core import device
from ..core.call import Call
from ..core.errors import UnsupportedError
from ..core.prepare import prepare
from . import dispatch


def attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
              query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
              implementation=None, return_residual=False, fp8_recipe=None, logits_soft_cap=None,
              query_segment_ids=None, key_value_segment_ids=None, sinks=None):
    """Scaled dot-product attention with ``jax.nn.dot_product_attention``'s arguments and semantics.

    Args:
      query: (B, T, N, H) or (T, N, H), a floating dtype. float64 needs JAX's x64 mode
        (``jax.enable_x64(True)``); without it JAX holds no float64 array, and NumPy float64
        inputs are taken as float32 (JAX warns): the call is judged (``explain``), computed
        and returned in float32, as jax.nn's would be.
      key, value: (B, S, K, H) or (S, K, H), the same dtype; K divides N (GQA/MQA:
        query head n reads key/value head n // (N // K)).
      bias: float, broadcastable to (B, N, T, S); added to the scaled logits.
      mask: bool, broadcastable to (B, N, T, S); True = attend.
      scale: logits scale, default 1 / sqrt(H).
      is_causal: query t sees keys s <= t.
      query_seq_lengths: (B,) ints in [0, T] (an array, or a Python list or tuple as jax.nn takes);
        output rows t >= length are zero.
      key_value_seq_lengths: (B,) ints in [0, S] (likewise); keys s >= length are hidden.
      local_window_size: w or (left, right): query t sees keys t-left <= s <= t+right.
      implementation: None or "auto" (the best correct path available: the measured pick of
        ``attnlab tune``'s dispatch table when it holds an entry for this device, these library
        versions and this shape bucket (``attnlab.api.dispatch``), else the static rule: cuDNN on an
        NVIDIA GPU when it supports the input, else XLA, else naive (float64, soft-capped logits); a
        backend may claim a class of inputs through its ``auto_claim`` hook), or a
        registered backend name ("naive", "xla", "cudnn", ...). A named backend that cannot run the input raises
        ``UnsupportedError`` with the reason; nothing falls back silently.
      return_residual: also return the logsumexp of each query row's logits, as jax.nn does
        (naive, xla and cudnn can; other backends raise ``UnsupportedError``).
      fp8_recipe: with ``implementation="cudnn-fp8"``: the FP8 recipe by name (``amax``, the default,
        ``unit``, ``hadamard``, ...; ``attnlab.backends.fp8_recipe``), i.e. the backend ``cudnn-fp8-<recipe>``.
      logits_soft_cap: None or a positive float c (beyond jax.nn; Gemma-2 uses 50): the logits
        ``scale * q.k + bias`` become ``c * tanh(logits / c)`` before masking. naive, tokamax and
        attnlab-decode run it; xla, cuDNN, TransformerEngine and the PyTorch peers refuse it.
      query_segment_ids, key_value_segment_ids: None, or (B, T) and (B, S) ints given together
        (beyond jax.nn; packed rows): query t sees key s only when their ids are equal and >= 0, on
        top of every other rule; query rows with a negative id are padding and give 0. naive, xla
        and tokamax apply them as a dense mask; cuDNN runs them packed (Hopper, contiguous ids).
      sinks: None or (N,) floating logits, one per query head (beyond jax.nn; gpt-oss's attention
        sinks): each row's softmax gets one more logit with no value, out = sum_s e^(l_s - m) v_s /
        (e^(sink - m) + sum_s e^(l_s - m)), m = max(max_s l_s, sink); the residual includes it. A row
        that sees no key gives 0 (all weight on the sink). Gradients reach sinks. naive, xla and
        attnlab-decode (forward only) run it; every other backend refuses (``explain`` says why).
        sinks = -inf is the call without.

    Returns:
      An array shaped and typed like ``query``. B, T, S or N may be 0, as in jax.nn: such an empty
      call runs no backend (``implementation`` must still be None, "auto" or a registered name) and
      gives jax.nn's result, zeros (with ``return_residual`` an lse of -inf, the log of an empty
      sum). Rows that see no key at all are implementation-defined (naive and the reference give 0;
      XLA gives the mean of values).
      With ``return_residual=True`` a pair ``(out, lse)``: lse is (B, T, N) (or (T, N)) in
      ``query``'s dtype, log sum_s exp(scale * q.k + bias) over the keys the row sees, and
      carries no gradient (jax.nn stops it; cuDNN ignores its cotangent). Rows that see no key
      and padded query rows: a large negative finite value (naive: -0.7 x the dtype's max,
      capped at float32's; xla: jax.nn's masked-logit value, which overflows to -inf in float16).
    """
    p = prepare(query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
                local_window_size=local_window_size, return_residual=return_residual,
                logits_soft_cap=logits_soft_cap, query_segment_ids=query_segment_ids,
                key_value_segment_ids=key_value_segment_ids, sinks=sinks, allow_empty=True)
    if p.empty:
        return empty_result(p, with_fp8_recipe(implementation, fp8_recipe), bool(return_residual))
    backend = select(p, with_fp8_recipe(implementation, fp8_recipe), mode=_mode_of(query))
    if p.return_residual:
        out, lse = backend.run(p)
        return out.reshape(p.out_shape), lse.reshape(p.out_shape[:-1])
    out = backend.run(p)
    return out.reshape(p.out_shape)


def empty_result(p, implementation, return_residual: bool, shape=None):
    """jax.nn's result for an empty call (``p.empty``: B, T, S or N = 0), computed by no backend: zeros
    shaped and typed like the query, and with ``return_residual`` the lse, -inf (the log of an empty
    sum over keys; with sinks, the sink on each row that is not padding). Gradients through them are zeros, as
    jax.nn's are.
    ``implementation`` is checked as ``select`` checks it (a str, "auto" or a registered name);
    ``shape``: the output's (default ``p.out_shape``; a decode call passes its query's)."""
    backends.named(implementation)             # an unknown name is an error here too
    dtype = jax.dtypes.canonicalize_dtype(p.query.dtype)
    shape = p.out_shape if shape is None else tuple(shape)
    out = jnp.zeros(shape, dtype)
    return (out, _empty_lse(p, dtype).reshape(shape[:-1])) if return_residual else out


def _empty_lse(p, dtype):
    """(B, T, N) the lse of an empty call: -inf, or with sinks and S = 0 the sink alone on each row that is not
    padding (as when every key is hidden); no gradient, as every lse."""
    lse = jnp.full(p.query.shape[:3], -jnp.inf, dtype)
    if getattr(p, "sinks", None) is None:
        return lse
    keep = query_keep(p)
    sink = jnp.broadcast_to(p.sinks.astype(dtype), lse.shape)
    return jax.lax.stop_gradient(sink if keep is None else jnp.where(keep[:, :, None], sink, lse))


def with_fp8_recipe(implementation, fp8_recipe):
    """``implementation`` with the FP8 recipe applied: ("cudnn-fp8", "hadamard") -> "cudnn-fp8-hadamard"
    (the backend's ``recipe_variant``; only ``backends.recipe_backends()`` take a recipe)."""
    if fp8_recipe is None:
        return implementation
    takers = backends.recipe_backends()
    if not isinstance(implementation, str) or implementation.lower() not in takers:   # names in any case, as get
        raise ValueError(f"fp8_recipe needs implementation={' or '.join(map(repr, takers))}, "
                         f"got implementation={implementation!r}")
    return backends.get(implementation.lower()).recipe_variant(fp8_recipe)


def _mode_of(x) -> str:
    """"train" when ``x`` is being differentiated (jax.grad / vjp / jvp trace it), else "fwd": the
    dispatch table's mode for this call (best effort, from the tracer's type)."""
    return "train" if type(x).__name__ in ("JVPTracer", "LinearizeTracer") else "fwd"


@functools.lru_cache(maxsize=None)
def running_version(name: str) -> str | None:
    """The running version of jax, jaxlib, cudnn (the device's; None without one) or an optional
    backend library (import name; None when absent): what a dispatch entry's versions must equal."""
    if name == "jax":
        return jax.__version__
    if name == "jaxlib":
        return jaxlib.__version__
    if name == "cudnn":
        return device.current().cudnn_version_str
    return backends.library_versions().get(name)


def auto_ineligible(b: backends.Backend) -> str | None:
    """Why the dispatch table may never pick ``b`` (None: it may): a PyTorch peer is no JAX op (it
    cannot run under jit/grad), and a backend judged at its own looser limit (FP8) is not as accurate
    as the static rule's choice."""
    if b.native:
        return "not a JAX op (cannot run under jax.jit or jax.grad)"
    if b.fp8:
        return "an FP8 path (computes in float8 whatever its inputs)"
    if b.rel_l2_limit is not None:
        return f"judged at its own looser limit (rel L2 <= {b.rel_l2_limit})"
    return None


def static_rule(spec: Call, mode: str = "fwd") -> tuple[backends.Backend, str]:
    """The static rule's backend and why: a backend's ``auto_claim``, else the first of ``AUTO_ORDER``
    that can run ``spec`` (what auto runs without a usable dispatch entry). A claim is honoured only where
    the backend runs the call (``why_not``), and in mode "train" (a gradient seen) only with a backward pass."""
    # backends outside AUTO_ORDER that claim a class of inputs (attnlab-decode: small T, long S)
    for b in backends.all_backends():
        if b.auto_claim(spec) is None and b.why_not(spec) is None and (
                mode != "train" or b.mode_reason(spec, "fwd+bwd") is None):
            return b, f"static rule: {b.name} claims this input"
    for name in backends.AUTO_ORDER:
        b = backends.get(name)
        # the backward pass too: auto cannot see grad(jit(f)), so it never picks a path a gradient breaks
        if b.why_not(spec) is None and b.mode_reason(spec, "fwd+bwd") is None:
            return b, f"static rule: first of {', '.join(backends.AUTO_ORDER)} that can run it"
    raise UnsupportedError("auto", "no registered backend supports this input")


def _measured(spec: Call, mode: str) -> tuple[backends.Backend | None, str | None]:
    """(the dispatch table's backend, why) or (None, why it was not used; None when there is no table)."""
    if not dispatch.enabled():
        return None, f"{dispatch.ENV_VAR}=off"
    try:
        table = dispatch.load_cached()
    except dispatch.DispatchError as e:
        return None, str(e)
    if not table.entries:
        return None, None
    found = dispatch.lookup(table, dispatch.bucket(spec, mode), device.current().kind, running_version)
    if found.entry is None:
        return None, found.reason
    name = found.entry["backend"]
    try:
        b = backends.get(name)
    except ValueError:
        return None, f"dispatch entry names {name}, which is not registered here"
    # Always ask for the backward pass too: ``_mode_of`` sees jax.grad but not grad(checkpoint(f)),
    # grad(jit(f)) or grad(vmap(f)), so a forward entry must never name a backend a gradient would break.
    why = b.why_not(spec) or auto_ineligible(b) or b.mode_reason(spec, "fwd+bwd")
    if why:
        return None, f"dispatch entry names {name}, which cannot run this input ({why})"
    return b, dispatch.describe(found.entry, found.path)


def auto(spec: Call, mode: str = "fwd") -> tuple[backends.Backend, str]:
    """Auto's backend for ``spec`` and why: the dispatch table's measured pick when it has a usable
    entry for this device, versions and bucket (``mode`` "fwd" or "train"), else the static rule
    (saying why the table was not used)."""
    b, why = _measured(spec, mode)
    if b is not None:
        return b, why
    s, rule = static_rule(spec, mode)
    return s, f"{why}: {rule}" if why else rule


def why_not(b: backends.Backend, spec: Call, mode: str = "fwd") -> str | None:
    """Why ``b`` cannot run ``spec`` in ``mode`` ("train": its backward pass too), or None."""
    return b.why_not(spec) or (b.mode_reason(spec, "fwd+bwd") if mode == "train" else None)


def select(spec: Call, implementation=None, *, mode: str = "fwd") -> backends.Backend:
    """The backend that runs ``spec``: the named one (or UnsupportedError), or auto's choice (``auto``)."""
    b = backends.named(implementation)
    if b is None:
        return auto(spec, mode)[0]
    if reason := why_not(b, spec, mode):
        raise UnsupportedError(b.name, reason)
    return b


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Which backend auto would run, and for every backend why it can or cannot."""

    chosen: str                      # "none" for an empty call (B, T, S or N = 0): no backend runs
    reasons: dict[str, str | None]   # backend name -> None (can run) or the reason it can't
    spec: Call | None       # None for an empty call
    #: why auto picks ``chosen``: the dispatch table's measurement, or the static rule and why the
    #: table was not used (``dispatch entry tuned with jax 0.11.1, running jax 0.11.2: static rule: ...``)
    why: str = ""

    def __str__(self) -> str:
        return "\n".join([f"auto runs: {self.chosen}" + (f": {self.why}" if self.why else ""), *reason_lines(self.reasons)])


def group_reasons(reasons: dict[str, str | None]) -> dict[str | None, list[str]]:
    """Backend names by the reason they cannot run (None: they can), each reason once, in first-seen order."""
    out: dict[str | None, list[str]] = {}
    for name, why in reasons.items():
        out.setdefault(why, []).append(name)
    return out


def reason_lines(reasons: dict[str, str | None], width: int = 88) -> list[str]:
    """``explain``'s lines: a line per backend that can run (``ok``) or has a reason of its own, its
    name padded to the longest such name; a reason shared by several backends once, its names after it
    (wrapped at ``width`` between names, never inside one)."""
    groups = group_reasons(reasons)
    own = [(n, why) for why, names in groups.items() for n in names if why is None or len(names) == 1]
    pad = max((len(n) for n, _ in own), default=0)
    lines = [f"  {n:<{pad}}  {'ok' if why is None else 'no: ' + why}" for n, why in own]
    for why, names in groups.items():
        if why is not None and len(names) > 1:
            lines.append(f"  no: {why} ({len(names)} backends):")
            lines += textwrap.wrap(", ".join(names), width, initial_indent=" " * 6, subsequent_indent=" " * 6,
                                   break_on_hyphens=False, break_long_words=False)
    return lines


#: ``explain``'s modes -> the mode a backend is asked about.
_EXPLAIN_MODES = {"fwd": "fwd", "train": "train", "fwd+bwd": "train"}
#: attention's keyword arguments, which explain takes too
_ATTENTION_KEYWORDS = {n for n, a in inspect.signature(attention).parameters.items() if a.kind == a.KEYWORD_ONLY}


def explain(query, key, value, bias=None, mask=None, *, mode: str = "fwd", **kwargs) -> Explanation:
    """Say which backend ``implementation=None`` would run on these inputs (``mode="train"``: when
    differentiated; ``"fwd+bwd"``, the sweeps' name, is the same), why (measured or the static rule), and why not
    the others."""
    if mode not in _EXPLAIN_MODES:
        raise ValueError(f"mode must be 'fwd' or 'train' (or 'fwd+bwd', the sweeps' name), got {mode!r}")
    mode = _EXPLAIN_MODES[mode]
    unknown = sorted(set(kwargs) - _ATTENTION_KEYWORDS)
    if unknown:
        raise TypeError(f"explain() got keyword arguments that attention does not take: {', '.join(unknown)}")
    for picks_a_path in ("implementation", "fp8_recipe"):      # explain says what implementation=None picks
        kwargs.pop(picks_a_path, None)
    p = prepare(query, key, value, bias, mask, allow_empty=True, **kwargs)
    if p.empty:
        return Explanation("none", {}, None, f"an empty call (query {p.out_shape}, key {tuple(key.shape)}): no "
                           "backend runs; attention returns jax.nn's zeros (lse -inf)")
    chosen, why = auto(p, mode)
    reasons = {b.name: why_not(b, p, mode) for b in backends.all_backends()}
    return Explanation(chosen.name, reasons, p, why)
