"""``serving_attention``: one serving step's attention: ragged requests, prefill chunks and decodes in one call.

Shapes (the letters used throughout)::

    q           (T_total, N, H)   the new tokens of all B requests packed token by token: request b's
                                  q_len[b] = q_starts[b+1] - q_starts[b] >= 0 tokens start at row
                                  q_starts[b] (0: an idle slot of a fixed B, which reads nothing); rows
                                  at >= q_starts[B] are padding of the fixed token budget T_total (their
                                  output rows are 0)
    q_starts    (B+1,) int32      cumulative starts, q_starts[0] = 0
    kv_lengths  (B,) int32        request b's cached tokens *including* its new ones:
                                  q_len[b] <= kv_lengths[b] <= S_max
    k_cache     (B, S_max, K, H)  contiguous; or pages (num_pages, page_size, K, H) with
    v_cache                       page_table (B, pages_per_request) int32, S_max = pages_per_request
                                  x page_size (vLLM's layout, ``attnlab.kernels.pages``)

N query heads share K KV heads (G = N / K, query head n reads KV head n // G); H is the head dim.
Query i of request b sits at position ``kv_lengths[b] - q_len[b] + i`` and attends the keys at
positions <= its own (causal, bottom-right aligned per request): a decode request (q_len 1..8) sees
its whole cache, a prefill chunk sees the cache before it and its own tokens causally.
With ``local_window_size`` (jax.nn's argument: an int w means (w, w), or (left, right)) a query at
position p sees only the keys in [p - left, p]: the call is causal, so ``right`` is allowed (as jax.nn
allows it with ``is_causal``) and changes nothing. The serving kernel's plan starts each unit at its first
visible key (``serving_plan(..., local_window_size=)``: a plan is made for one window; at that key's block
for pages of >= block_k keys, ``page_size=``), so stream-K balances only the windowed work; the xla path masks.
``decode_attention`` is the uniform special case (every q_len equal to T, q as (B, T, N, H)).

Paths (``implementation``): ``"attnlab-decode"``: attnlab's serving kernel (``kernels.serving``, Pallas
Triton: a balanced plan of (request, query tile, KV chunk) pieces, ``kernels.serving_plan``); ``"xla"``:
masked attention in jax.numpy (``backends.masked_serving``, any platform); every other backend refuses
with its reason (``explain_serving``). None / ``"auto"``: the kernel on an NVIDIA GPU, else xla.

``plan``: a ``ServingPlan`` from ``serving_plan(q_starts, kv_lengths, ...)`` computed once per step
(inside jit from traced lengths, or on the host) and passed to every layer's call.

Checks happen before JAX sees the arrays; errors name the argument and the rule (``core.checks``).
Under ``jax.jit`` with traced ``q_starts``/``kv_lengths`` the value checks are skipped; lengths out of
their rules then give implementation-defined rows (the kernel clamps and never reads out of bounds).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import backends
from ..core.call import Call
from ..core.checks import _is_tracer, _shape, check_serving_lengths, length_values, normalise_window, within_reach
from ..core.errors import UnsupportedError
from ..kernels.serving_plan import ServingPlan, make_serving_plan, page_mismatch
from .decode import CallExplanation, cache_call, cache_problem

ARGUMENT_NAMES = {"batch": "kv_lengths size B", "q_len": "q tokens T_total", "kv_len": "k_cache length S_max",
                  "heads": "q heads N", "kv_heads": "k_cache heads K", "head_dim": "q head dim H"}


#: A serving call's static description and the call with its arrays: a ``Call`` of kind serving, whose
#: ``problem`` is Problem(B, T_total, S_max, N, K, H, dtype, causal=True, window) (q_len the token budget
#: T_total; a paged or quantized cache's page size, dtype and scale layout). The names kept for one release.
ServingSpec = ServingCall = Call


def prepare_serving(q, k_cache, v_cache, q_starts, kv_lengths, *, page_table=None, scale=None,
                    logits_soft_cap=None, plan=None, sinks=None, local_window_size=None, k_scale=None,
                    v_scale=None) -> Call:
    """Check every argument of a serving call (module docstring) and describe it."""
    qs, ks, vs = _shape("q", q), _shape("k_cache", k_cache), _shape("v_cache", v_cache)
    if len(qs) != 3:
        raise ValueError(f"q must have rank 3 (T_total, N, H), got shape {qs}")
    if not hasattr(kv_lengths, "shape"):
        kv_lengths = np.asarray(kv_lengths)
    if not hasattr(q_starts, "shape"):
        q_starts = np.asarray(q_starts)
    if len(_shape("kv_lengths", kv_lengths)) != 1:
        raise ValueError(f"kv_lengths must have shape (B,), got {tuple(kv_lengths.shape)}")
    B = int(kv_lengths.shape[0])
    T_total, N, H = qs
    starts = length_values("q_starts", q_starts, B + 1, "B+1",
                           f": each of the B={B} requests of kv_lengths starts its tokens, then they end")
    lengths = length_values("kv_lengths", kv_lengths, B)
    if page_table is None and len(ks) == 4 and ks[0] != B:
        raise ValueError(f"k_cache batch size {ks[0]} must equal kv_lengths size B={B} (one cache row per request)")
    problem, S = cache_problem(ARGUMENT_NAMES, (B, T_total, N, H), (ks, vs), q, k_cache, v_cache, kv_lengths,
                               page_table, k_scale, v_scale, True, local_window_size, paged_q_len=1)
    if starts is not None and lengths is not None:
        check_serving_lengths(starts, lengths, T_total, S)
    if plan is not None:
        _check_plan(plan, (T_total, B, N, problem.kv_heads, H), S, problem.window, problem.page_size, starts, lengths)

    return cache_call("serving", problem, N, H, scale, logits_soft_cap, sinks, q, k_cache, v_cache, kv_lengths,
                      page_table, q_starts=jnp.asarray(q_starts).astype(jnp.int32), plan=plan, k_scale=k_scale,
                      v_scale=v_scale)


def _check_plan(plan, sizes, s_max, window, page_size, starts, lengths):
    if not isinstance(plan, ServingPlan):
        raise TypeError(f"plan must be an attnlab ServingPlan (attnlab.serving_plan(...)), got {type(plan).__name__}")
    if tuple(plan.sizes) != tuple(sizes):
        raise ValueError(f"plan was made for (T_total, B, N, K, H)={tuple(plan.sizes)}, this call is {tuple(sizes)}")
    if plan.kv_len_max < s_max:     # the plan clamps every length to it: the keys past it would be left out
        raise ValueError(f"plan was made for kv_len_max={plan.kv_len_max}, below this call's S_max={s_max} (the "
                         f"cache's keys per request): pass kv_len_max={s_max} to serving_plan")
    left = None if window is None else window[0]
    if plan.window_left != left:
        raise ValueError(f"plan was made for local_window_size left={plan.window_left}, this call's is {left} "
                         "(pass the call's local_window_size to serving_plan)")
    if why := page_mismatch(plan, page_size):
        raise ValueError(why)
    if starts is None or lengths is None or any(map(_is_tracer, plan.lengths)):
        return      # traced: ``_unless_stale`` checks them on the device
    for name, given, planned in zip(("q_starts", "kv_lengths"), (starts, lengths), map(np.asarray, plan.lengths)):
        if (diff := np.flatnonzero(given != planned)).size:
            i = int(diff[0])
            raise ValueError(f"plan was made for other lengths: {name}[{i}]={int(given[i])}, the plan's "
                             f"{int(planned[i])} (make one plan per step: serving_plan(q_starts, kv_lengths, ...))")


def _unless_stale(out, plan, call):
    """``out``, or NaN where ``plan`` was made for other lengths than the call's and either is traced (under jit
    ``_check_plan`` cannot see them; a stale plan's pieces would give a wrong answer that looks right). A plan
    made from the call's own traced lengths compares an array with itself, which XLA folds away."""
    if plan is None or not any(map(_is_tracer, (*plan.lengths, call.q_starts, call.kv_lengths))):
        return out
    same = jnp.array_equal(plan.lengths[0], call.q_starts) & jnp.array_equal(plan.lengths[1], call.kv_lengths)
    return jnp.where(same, out, jnp.nan)


def serving_plan(q_starts, kv_lengths, *, total_tokens: int, kv_len_max: int, heads: int, kv_heads: int,
                 head_dim: int, dtype="bfloat16", config=None, local_window_size=None, page_size=None):
    """The serving kernel's plan for one step (``kernels.serving_plan.make_serving_plan``): call it once
    (inside jit with traced lengths, or on the host) and pass it as ``plan=`` to every layer of the same
    ``local_window_size`` (a windowed layer needs a plan made with its window) and cache layout
    (``page_size``: the paged cache's, None: contiguous; a windowed plan for pages of >= block_k keys starts
    its blocks at page-aligned keys). ``config``: a ``ServingConfig`` (tiles, and ``kv_mma``: a quantized
    cache's products)."""
    window = within_reach(normalise_window(local_window_size), total_tokens + kv_len_max)   # as the call's Problem
    return make_serving_plan(q_starts, kv_lengths, total_tokens=total_tokens, kv_len_max=kv_len_max, heads=heads,
                             kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, config=config,
                             window_left=None if window is None else window[0], page_size=page_size)


def _refusal(b, spec: Call) -> str | None:
    """Why backend ``b`` cannot run the serving call: ``available()``, a quantized cache it does not declare it takes
    (``takes_kv_scales``), then its ``supports_serving``."""
    return b.available() or b.kv_scales_refusal(spec) or b.supports_serving(spec)


def select_serving(spec: Call, implementation=None):
    """The backend that runs this call: auto's choice, or the named one (UnsupportedError with its reason)."""
    b = backends.named(implementation)
    if b is None:
        every = backends.all_backends()
        for b in every:      # a kernel that claims the call, else the first portable path that runs it
            if not b.portable and b.auto_serving_reason(spec) is None:
                return b
        for b in every:
            if b.portable and _refusal(b, spec) is None:
                return b
        raise UnsupportedError("auto", "no registered backend runs this serving call")
    why = _refusal(b, spec)
    if why:
        raise UnsupportedError(b.name, why)
    return b


def serving_attention(q, k_cache, v_cache, q_starts, kv_lengths, *, page_table=None, scale=None,
                      logits_soft_cap=None, implementation=None, plan=None, sinks=None, local_window_size=None,
                      k_scale=None, v_scale=None):
    """Attention of one serving step (module docstring for the shapes and the rule).

    Args:
      q: (T_total, N, H) float16/bfloat16/float32 (float64: the xla path, in float64), the requests' new tokens
        packed, padding at the end.
      k_cache, v_cache: (B, S_max, K, H), or pages (num_pages, page_size, K, H) with ``page_table``.
      q_starts: (B+1,) int, q_starts[0] = 0, q_len[b] = q_starts[b+1] - q_starts[b] >= 0 (0: an idle slot).
      kv_lengths: (B,) int, q_len[b] <= kv_lengths[b] <= S_max (the new tokens included).
      page_table: (B, pages_per_request) int32 for a paged cache.
      scale: logits scale, default 1 / sqrt(H). logits_soft_cap: None or c > 0: c * tanh(logits / c).
      implementation: None/"auto", "attnlab-decode" (the serving kernel), "xla", or any backend (refuses).
      plan: a ``ServingPlan`` (``attnlab.serving_plan``) for the kernel, computed once per step.
      sinks: None or (N,) float logits, ``attention``'s attention sinks (one more logit per query head in
        the softmax denominator, no value); the xla path and the serving kernel (in its merge) run them.
      local_window_size: None, an int w ((w, w)) or (left, right): a query at position p sees only keys
        in [p - left, p] (causal: right changes nothing); the kernel reads only the window's KV blocks.
      k_scale, v_scale: float32 scales of a quantized cache (float8_e4m3fn, float8_e5m2 or int8), as for
        ``decode_attention`` (``attnlab.core.kv_quant``): the serving kernel dequantizes in registers, xla in float32.

    Returns:
      (T_total, N, H) in q's dtype; padding rows 0.
    """
    call = prepare_serving(q, k_cache, v_cache, q_starts, kv_lengths, page_table=page_table, scale=scale,
                           logits_soft_cap=logits_soft_cap, plan=plan, sinks=sinks,
                           local_window_size=local_window_size, k_scale=k_scale, v_scale=v_scale)
    return _unless_stale(select_serving(call, implementation).run_serving(call), plan, call)


ServingExplanation = CallExplanation


def explain_serving(q, k_cache, v_cache, q_starts, kv_lengths, *, page_table=None, scale=None,
                    logits_soft_cap=None, sinks=None, local_window_size=None, k_scale=None,
                    v_scale=None) -> ServingExplanation:
    """Which path ``serving_attention(implementation=None)`` runs, and why not each other one."""
    call = prepare_serving(q, k_cache, v_cache, q_starts, kv_lengths, page_table=page_table, scale=scale,
                           logits_soft_cap=logits_soft_cap, sinks=sinks, local_window_size=local_window_size,
                           k_scale=k_scale, v_scale=v_scale)
    chosen = select_serving(call).name
    reasons = {b.name: _refusal(b, call) for b in backends.all_backends()}
    return ServingExplanation(chosen, reasons, call)
