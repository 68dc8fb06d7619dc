"""``decode_attention``: T = 1..64 new tokens per sequence against a KV cache of valid lengths.

Semantics (the append / verification rule of FlashInfer and vLLM)::

    q        (B, T, N, H)      the T new tokens' queries
    k_cache  (B, S_max, K, H)  keys; positions >= kv_lengths[b] are padding (never attended;
    v_cache  (B, S_max, K, H)    attnlab's own kernel never reads them)
    kv_lengths (B,) int        valid length of each cache, *including* the T new tokens:
                               T <= kv_lengths[b] <= S_max

Query t of batch b sits at position ``kv_lengths[b] - T + t``. With ``causal=True`` it attends
the keys at positions ``<= kv_lengths[b] - T + t`` (bottom-right aligned, per batch element);
with ``causal=False`` every valid key ``< kv_lengths[b]``. No output row is empty (query t
always sees key 0). At T = 1 both rules are the same.

Sliding window (``local_window_size``, jax.nn's argument): an int w means (w, w), or (left, right). Query t
(at absolute position p = kv_lengths[b] - T + t) then sees only the keys at positions in
[p - left, p + right], intersected with the rule above and [0, kv_lengths[b]): positions are absolute in
the cache, not the top-left indices ``attention``'s window counts from. With ``causal=True`` ``right`` is
allowed, as jax.nn allows it, and changes nothing (the causal mask already hides every key past p: jax.nn
ANDs the two masks); with ``causal=False`` it bounds the keys after p. Every row still sees its own key
p. attnlab-decode loads only the KV blocks from the block of kv_lengths[b] - T - left on; the generic
paths (naive, xla) fold the window into their decode mask; every other backend refuses, naming it
(``Backend.takes_decode_window``).

Paths (``implementation``): the chosen backend's ``run_decode`` runs the call, whatever the backend.
  * a backend with a decode kernel of its own overrides ``run_decode`` (``"attnlab-decode"``: attnlab's
    Pallas kernel, ``attnlab.kernels.decode``, which knows the rule natively (no mask) and reads only the
    valid keys; interpret mode on the CPU).
  * every other registered backend (``"naive"``, ``"xla"``, ``"cudnn"``, ...) keeps the default: the same
    call expressed as ``attnlab.attention(q, k, v, mask=M, key_value_seq_lengths=kv_lengths)``
    (``backends.masked_decode``). ``M`` is a dense bool (B, 1, T, S_max) mask ``s <= kv_lengths[b] - T + t``,
    built only when causal and T > 1 (cuDNN turns it into a dense bias; at T = 1 or non-causal the
    lengths alone say it all). A backend that cannot run the call refuses with its own reason
    (``Backend.why_not_decode``, an ``UnsupportedError``); nothing falls back silently.
  * ``None`` / ``"auto"``: the first registered backend whose ``auto_reason`` claims the call
    (attnlab-decode's: ``backends.attnlab_decode.auto_reason``), else ``attention``'s auto choice.

Validation happens before JAX sees the arrays; errors name the argument and the rule. The rules
``attention`` has too are written once, in ``attnlab.core.checks``: the sizes are ``Problem``'s
(``call_problem``: e.g. ``q heads N=3 must be a multiple of k_cache heads K=2``), dtypes, key/value
shapes, ``causal``, the lengths array, scale and soft cap have one shared helper each (B may be 0, as
``attention``'s may: an empty batch runs no kernel and gives a (0, T, N, H) array); only the
decode rules (rank 4, a page table, T <= S_max, T <= kv_lengths[b] <= S_max) are checked here. Under
``jax.jit`` with traced ``kv_lengths`` the value checks are skipped (``attnlab.core.checks.length_values``);
lengths outside [T, S_max] then give implementation-defined rows (the kernel clamps them to
[0, S_max] and never reads out of bounds).
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from .. import backends
from ..backends.masked_decode import decode_mask  # noqa: F401 (re-exported)
from ..core.call import Call
from ..core.checks import (_is_tracer, _shape, as_lengths, call_problem, check_flag, check_kv_shapes, check_scale,
                           check_sinks, check_soft_cap, common_float_dtype, length_values, normalise_window)
from ..core.errors import UnsupportedError
from ..core.kv_quant import check_kv_scales
from ..core.problem import Problem
from ..kernels.pages import validate_paged
from . import dot_product as api
from .dot_product import empty_result, reason_lines

#: How ``decode_attention``'s errors name the sizes of a call (``checks.call_problem``).
ARGUMENT_NAMES = {"batch": "q batch size B", "q_len": "q length T", "kv_len": "k_cache length S_max",
                  "heads": "q heads N", "kv_heads": "k_cache heads K", "head_dim": "q head dim H"}


def DecodeSpec(problem: Problem, scale=None, scale_is_static: bool = True, page_size=None, soft_cap=None,
               has_sinks: bool = False, kv_dtype=None, kv_scale=None) -> Call:
    """The static ``Call`` of a decode call, in the argument order of the type it replaces (kept for one
    release): ``problem`` is Problem(B, T, S_max, N, K, H, dtype, causal, window); the paging and a quantized
    cache become the problem's."""
    if page_size is not None or kv_dtype is not None:
        problem = dataclasses.replace(problem, page_size=page_size, kv_dtype=kv_dtype, kv_scale=kv_scale)
    return Call(problem, scale, kind="decode", scale_is_static=scale_is_static, soft_cap=soft_cap,
                has_sinks=has_sinks, has_kv_lengths=True)


#: A decode call with its arrays: a ``Call`` of kind decode (the name kept for one release).
DecodeCall = Call


def check_cache_dtypes(q, k_cache, v_cache, k_scale, v_scale, *, paged: bool):
    """(q's dtype, cache dtype or None, scale layout or None): a float cache shares q's dtype, a quantized
    one (``core.kv_quant.check_kv_scales``) comes with its scales and q has a float dtype of its own."""
    kv_dtype, layout = check_kv_scales(k_cache, v_cache, k_scale, v_scale, paged=paged)
    if kv_dtype is None:
        return common_float_dtype({"q": q, "k_cache": k_cache, "v_cache": v_cache}), None, None
    return common_float_dtype({"q": q}), kv_dtype, layout


def cache_problem(arg_names: dict, qs: tuple, shapes: tuple, q, k_cache, v_cache, kv_lengths, page_table, k_scale,
                  v_scale, causal: bool, local_window_size, *, paged_q_len: int, may_be_empty=()):
    """The ``Problem`` of a call against a KV cache (decode or serving) and the cache's length S_max: the caches'
    shapes ``shapes`` (k, v) against q's as (B, T, N, H) ``qs`` (a paged cache through its page table), the dtypes
    (a quantized cache with its scales), then the sizes (``call_problem``, errors in ``arg_names``). The paging
    and a quantized cache are the problem's; None for an empty call (a size in ``may_be_empty`` is 0)."""
    ks, vs = shapes
    page_size = None
    if page_table is not None:
        page_size, s_max = validate_paged(k_cache, v_cache, page_table, kv_lengths, batch=qs[0], q_len=paged_q_len)
        ks = vs = (qs[0], s_max, ks[2], ks[3])     # checked below as its contiguous twin
    if len(ks) != 4:
        raise ValueError(f"k_cache must have rank 4 (B, S_max, K, H), got shape {ks}")
    check_kv_shapes(("q", "k_cache", "v_cache"), qs, ks, vs)
    dtype, kv_dtype, kv_scale = check_cache_dtypes(q, k_cache, v_cache, k_scale, v_scale, paged=page_table is not None)
    B, T, N, H = qs
    problem = call_problem(arg_names, (B, T, ks[1], N, ks[2], H), dtype, causal, normalise_window(local_window_size),
                           may_be_empty=may_be_empty)
    if problem is not None and (page_size is not None or kv_dtype is not None):
        problem = dataclasses.replace(problem, page_size=page_size, kv_dtype=kv_dtype, kv_scale=kv_scale)
    return problem, int(ks[1])


def cache_call(kind: str, problem, heads: int, head_dim: int, scale, logits_soft_cap, sinks, q, k_cache, v_cache,
               kv_lengths, page_table, **arrays) -> Call:
    """A decode or serving ``Call`` after its problem (``cache_problem``): the scale, soft cap and sinks checked
    (``core.checks``), the lengths and page table as int32, the effective scale (default 1 / sqrt(H))."""
    scale = check_scale(scale)
    soft_cap = check_soft_cap(logits_soft_cap)
    sinks = check_sinks(sinks, heads)

    table = None if page_table is None else jnp.asarray(page_table).astype(jnp.int32)
    return Call(problem, 1.0 / math.sqrt(head_dim) if scale is None else scale, kind=kind,
                scale_is_static=not _is_tracer(scale), soft_cap=soft_cap, has_sinks=sinks is not None,
                has_kv_lengths=True, query=q, key=k_cache, value=v_cache,
                kv_lengths=jnp.asarray(kv_lengths).astype(jnp.int32), page_table=table, sinks=sinks, **arrays)


def prepare_decode(q, k_cache, v_cache, kv_lengths, *, causal=True, scale=None, page_table=None,
                   logits_soft_cap=None, sinks=None, local_window_size=None, k_scale=None,
                   v_scale=None) -> Call:
    """Check every argument of a decode call (see the module docstring) and describe it."""
    qs, ks, vs = _shape("q", q), _shape("k_cache", k_cache), _shape("v_cache", v_cache)
    if len(qs) != 4:
        raise ValueError(f"q must have rank 4 (B, T, N, H), got shape {qs}")
    problem, S = cache_problem(ARGUMENT_NAMES, qs, (ks, vs), q, k_cache, v_cache, kv_lengths, page_table, k_scale,
                               v_scale, check_flag("causal", causal), local_window_size, paged_q_len=qs[1],
                               may_be_empty=("batch",))
    B, T, N, H = qs
    if S < T:
        raise ValueError(f"k_cache length S_max={S} must be >= T={T}: the T new tokens must fit in the cache")
    kv_lengths = as_lengths(kv_lengths)
    vals = length_values("kv_lengths", kv_lengths, B)
    for b, n in enumerate([] if vals is None else vals.tolist()):
        if n < T:
            raise ValueError(f"kv_lengths[{b}]={n} < T={T}: the T new tokens must be in the cache")
        if n > S:
            raise ValueError(f"kv_lengths[{b}]={n} > S_max={S}: lengths must fit in k_cache/v_cache")
    return cache_call("decode", problem, N, H, scale, logits_soft_cap, sinks, q, k_cache, v_cache, kv_lengths,
                      page_table, k_scale=k_scale, v_scale=v_scale)


def select_decode(spec: Call, implementation=None):
    """The backend that runs this call (its ``run_decode``): the named one (or UnsupportedError with its
    ``why_not_decode``), or auto's: the first registered backend whose ``auto_reason`` claims the call,
    else ``attention``'s auto choice for the call as masked attention."""
    named = backends.named(implementation)
    if named is None:
        claimed = next((b for b in backends.all_backends() if b.auto_reason(spec) is None), None)
        if claimed is None and spec.kv_scale is not None:   # a quantized cache: a path that takes its scales
            claimed = next((b for b in backends.all_backends() if b.takes_kv_scales and b.portable
                            and b.why_not_decode(spec) is None), None)
        chosen = claimed or api.select(spec.as_attention(), None)
        if why := chosen.why_not_decode(spec):   # e.g. a window it takes not: a portable path that runs the call
            every = sorted(backends.all_backends(), key=lambda b: not b.portable)
            chosen = next((b for b in every if b.why_not_decode(spec) is None), None)
            if chosen is None:
                raise UnsupportedError("auto", f"no registered backend runs this decode call (first choice: {why})")
        return chosen
    return _accepting(named, spec)


def _accepting(backend, spec: Call):
    """``backend``, or UnsupportedError with its ``why_not_decode`` of the call."""
    why = backend.why_not_decode(spec)
    if why:
        raise UnsupportedError(backend.name, why)
    return backend


def decode_attention(q, k_cache, v_cache, kv_lengths, *, causal=True, scale=None, implementation=None,
                     page_table=None, logits_soft_cap=None, sinks=None, local_window_size=None, k_scale=None,
                     v_scale=None):
    """Attention of T new tokens against a KV cache of valid lengths (see the module docstring).

    Args:
      q: (B, T, N, H) float16/bfloat16/float32 (float64 on the generic paths).
      k_cache, v_cache: (B, S_max, K, H), q's dtype; K divides N (query head n reads kv head n // (N // K)).
      kv_lengths: (B,) int, T <= kv_lengths[b] <= S_max, counting the T new tokens.
      causal: query t sees keys at positions <= kv_lengths[b] - T + t (else every valid key).
      scale: logits scale, default 1 / sqrt(H).
      implementation: None/"auto", or any registered backend name ("attnlab-decode", "naive", ...).
      page_table: (B, pages_per_seq) int32 for a paged cache (vLLM's layout): then k_cache and
        v_cache are pages (P, page_size, K, H), sequence b's logical page i is physical page
        page_table[b, i], and S_max = pages_per_seq * page_size. attnlab-decode reads the pages
        through the table; a backend with a paged path of its own (``paged``, ``run_paged_decode``: cudnn)
        uses it; any other backend runs on the gathered contiguous twin (a copy of the cache).
      logits_soft_cap: None or a positive float c: logits -> c * tanh(logits / c) before masking
        (attnlab-decode applies it in the kernel; generic paths as ``attention`` does).
      sinks: None or (N,) float logits, ``attention``'s attention sinks; the masked path (naive, xla)
        and attnlab-decode's kernel (in its split combine, or in-kernel at one split) run them, cuDNN refuses.
      local_window_size: None, an int w ((w, w)) or (left, right): query t at position
        p = kv_lengths[b] - T + t sees only keys in [p - left, p + right] (module docstring);
        attnlab-decode reads only the window's KV blocks; naive and xla mask; other backends refuse.
      k_scale, v_scale: float32 scales of a quantized cache (k_cache/v_cache float8_e4m3fn, float8_e5m2
        or int8; ``attnlab.quantize_kv_cache`` makes both): () per tensor, (K,) per KV head, the cache's
        shape without H per token, or (P, K) per page of a paged cache (``attnlab.core.kv_quant``). The
        attended value is float32(stored) * scale; attnlab-decode dequantizes in registers, the masked
        path (naive, xla) in float32, other backends refuse.

    Returns:
      (B, T, N, H) in q's dtype.
    """
    d = prepare_decode(q, k_cache, v_cache, kv_lengths, causal=causal, scale=scale, page_table=page_table,
                       logits_soft_cap=logits_soft_cap, sinks=sinks, local_window_size=local_window_size,
                       k_scale=k_scale, v_scale=v_scale)
    if d.empty:                  # B = 0: an empty batch, whatever the path

        return empty_result(d, implementation, False, d.query.shape)
    return select_decode(d, implementation).run_decode(d)


def decode_on(backend, q, k_cache, v_cache, kv_lengths, **kwargs):
    """``decode_attention(q, k_cache, v_cache, kv_lengths, implementation=backend.name, **kwargs)`` on a backend in
    hand (a ``Backend``, e.g. the one a sweep cell looked up once): the same checks, refusal and result, no lookup."""
    d = prepare_decode(q, k_cache, v_cache, kv_lengths, **kwargs)
    if d.empty:
        return empty_result(d, None, False, d.query.shape)
    return _accepting(backend, d).run_decode(d)


@dataclasses.dataclass(frozen=True)
class CallExplanation:
    """What auto runs for a decode or serving call (``chosen``) and each backend's reason not to (None: it can)."""
    chosen: str
    reasons: dict[str, str | None]
    spec: Call | None   # the call (static facts and arrays), None for an empty batch

    def __str__(self) -> str:
        return "\n".join([f"auto runs: {self.chosen}", *reason_lines(self.reasons)])


DecodeExplanation = CallExplanation


def explain_decode(q, k_cache, v_cache, kv_lengths, *, causal=True, scale=None, page_table=None,
                   logits_soft_cap=None, sinks=None, local_window_size=None, k_scale=None,
                   v_scale=None) -> DecodeExplanation:
    """Which path ``decode_attention(implementation=None)`` runs, and why not each other one."""
    d = prepare_decode(q, k_cache, v_cache, kv_lengths, causal=causal, scale=scale, page_table=page_table,
                       logits_soft_cap=logits_soft_cap, sinks=sinks, local_window_size=local_window_size,
                       k_scale=k_scale, v_scale=v_scale)
    if d.empty:
        return DecodeExplanation("none", {}, None)
    chosen = select_decode(d, None).name
    reasons = {b.name: b.why_not_decode(d) for b in backends.all_backends()}
    return DecodeExplanation(chosen, reasons, d)
