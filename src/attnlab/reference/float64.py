"""The truth for tests and benchmarks: attention in NumPy float64, written apart from JAX.

``reference_attention`` takes ``attnlab.attention``'s arguments (arrays of any kind
convertible by ``np.asarray``) and returns a float64 ``np.ndarray`` shaped like query.
``reference_attention_grads`` gives d(sum(out * cotangent))/d(q, k, v) in float64.
``reference_attention(..., emulate=dtype)`` computes like the fused kernels do, in a low
precision ``dtype``: the baseline of the tolerance policy, whose numbers are
``attnlab.reference.tolerance`` (re-exported here) and which ``check_close`` applies; the policy in
words, written once, is docs/measuring.md ("Tolerance policy"). Rows that see no key at all are given
jax.nn's value there, the mean of V over all keys, and an lse of -inf; ``check_close`` also accepts 0
there (``attnlab.reference.rules``); with ``sinks`` such a row gives 0 (all weight on the sink) and an lse
of the sink. ``reference_attention(..., return_residual=True)`` gives
(out, lse), lse (B, T, N) float64 as ``jax.nn.dot_product_attention``'s residual.
"""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from ..core.checks import _is_tracer, common_float_dtype
from ..core.prepare import prepare
from . import rules
from .keyblocks import _pv, _round, _rows, _scores, _unrows
from .tolerance import (FLOORS, LIMIT_FACTOR, TF32_LIMIT, Verdict, default_matmul_is_tf32,  # noqa: F401 (re-exported)
                        policy_limit, rel_l2, row_rel_err, tolerance)

_LOW = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _np(x, dtype=np.float64):
    return None if x is None else np.asarray(x).astype(dtype)


def _positions(T, B, offset=0, query_positions=None):
    """(B or 1, T) int64 positions of the given query rows in their sequence."""
    if query_positions is None:
        return (offset + np.arange(T))[None, :]
    pos = np.asarray(query_positions).astype(np.int64)
    if pos.ndim == 1:
        pos = pos[None, :]
    if pos.shape[-1] != T or pos.shape[0] not in (1, B):
        raise ValueError(f"query_positions must have shape (T,) or (B, T) = ({B}, {T}), got {np.shape(query_positions)}")
    return pos


def _visible(T, S, B, is_causal, window, mask, kv_lengths, offset=0, query_positions=None, q_ids=None, kv_ids=None):
    """Bool (B or 1, N or 1, T, S): True where query t (at its position) may attend key s (of its segment, given
    segment ids ``q_ids`` (B, T) and ``kv_ids`` (B, S): ids equal and both >= 0, ``attnlab.core.segments``'
    rule, written here apart from the kernels' masks)."""
    t = _positions(T, B, offset, query_positions)[:, :, None]    # (B or 1, T, 1)
    s = np.arange(S)[None, None, :]
    vis = np.ones((t.shape[0], T, S), bool)
    if is_causal:
        vis &= s <= t
    if window is not None:
        vis &= (t - s <= window[0]) & (s - t <= window[1])
    vis = vis[:, None]
    if mask is not None:
        vis = vis & np.asarray(mask, bool)
    if kv_lengths is not None:
        kv = np.asarray(kv_lengths).reshape(B, 1, 1, 1)
        vis = vis & (np.arange(S).reshape(1, 1, 1, S) < kv)
    if q_ids is not None:
        q, kv = np.asarray(q_ids).astype(np.int64)[:, None, :, None], np.asarray(kv_ids).astype(np.int64)[:, None, None]
        vis = vis & (q == kv) & (q >= 0) & (kv >= 0)
    return vis


def _f32(x, low):
    """Round to float32 when emulating a kernel (its accumulators are float32)."""
    return x if low is None else x.astype(np.float32).astype(np.float64)


@dataclasses.dataclass
class _Forward:
    probs: np.ndarray | None   # (B, N, T, S); None for an empty call (B, T, S or N = 0: out is zeros)
    out: np.ndarray        # (B, T, N, H), padded query rows zeroed, rows that see no key: mean of V
    q: np.ndarray          # (B, T, N, H)
    k: np.ndarray          # grouped by key/value head: (B, K, S, H), in the inputs' dtype
    v: np.ndarray
    scale: float
    q_keep: np.ndarray     # (B, T) bool
    out_shape: tuple
    cap_slope: np.ndarray | None = None   # d(capped logits)/d(logits) = 1 - tanh^2, with a soft cap
    lse: np.ndarray | None = None         # (B, T, N) logsumexp of the visible logits; -inf: none or padded
    empty: np.ndarray | None = None       # (B, T, N) bool: the row sees no key (padded rows excluded)
    sink_probs: np.ndarray | None = None  # (B, N, T) the sink's softmax weight, with sinks


def _forward(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
             query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
             emulate=None, query_offset=0, query_positions=None, logits_soft_cap=None,
             query_segment_ids=None, key_value_segment_ids=None, sinks=None) -> _Forward:
    p = prepare(query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
                local_window_size=local_window_size, logits_soft_cap=logits_soft_cap, sinks=sinks,
                query_segment_ids=query_segment_ids, key_value_segment_ids=key_value_segment_ids, allow_empty=True)
    if p.empty:                                 # B, T, S or N = 0: jax.nn's zeros, nothing to compute
        B, T, N = p.query.shape[:3]
        q_keep = _kept_rows(p, B, T)
        lse = np.full((B, T, N), -np.inf)       # S = 0: an empty sum, or the sink alone on the rows kept
        if p.sinks is not None:
            lse = np.where(q_keep[:, :, None], _np(p.sinks).reshape(1, 1, N), lse)
        return _Forward(None, np.zeros(p.query.shape), None, None, None, float(p.scale), q_keep,
                        p.out_shape, lse=lse, empty=np.zeros((B, T, N), bool))
    sp = p
    low = _LOW.get(np.dtype(emulate).name) if emulate is not None else None
    B, T, N, S, K = sp.batch, sp.q_len, sp.heads, sp.kv_len, sp.kv_heads
    q = _round(_np(p.query), low)
    # (B, K, S, H) in the inputs' dtype, never expanded to N heads; made float64 a block of keys at a time
    kg, vg = (np.asarray(x).transpose(0, 2, 1, 3) for x in (p.key, p.value))
    # the scale and the window read here from the arguments, apart from prepare's reading (the paths')
    sc = 1.0 / np.sqrt(np.shape(query)[-1]) if scale is None else float(np.asarray(scale).reshape(()))
    vis = np.broadcast_to(_visible(T, S, B, bool(is_causal), _window(local_window_size), p.mask, p.kv_lengths,
                                   query_offset, query_positions, p.q_segment_ids, p.kv_segment_ids), (B, N, T, S))
    logits = _f32(_scores(_rows(q, K), kg, low).reshape(B, N, T, S) * sc, low)
    if p.bias is not None:
        logits = logits + _np(p.bias)
    cap_slope = None
    if sp.soft_cap is not None:                 # after scale and bias, before masking
        th = np.tanh(logits / sp.soft_cap)
        logits, cap_slope = _f32(sp.soft_cap * th, low), 1.0 - th**2
    w = np.where(vis, logits, -np.inf)          # then, in place: exp(logits - row max); masked keys give 0
    row_max = w.max(axis=-1, keepdims=True)
    sink = None if p.sinks is None else _np(p.sinks).reshape(1, N, 1, 1)
    if sink is not None:                        # the sink: one more logit, with no value
        row_max = np.maximum(row_max, sink)
    np.subtract(w, np.where(np.isfinite(row_max), row_max, 0.0), out=w)
    np.exp(w, out=w)
    denom = w.sum(axis=-1, keepdims=True)
    sink_w = None if sink is None else np.exp(sink - np.where(np.isfinite(row_max), row_max, 0.0))
    if sink_w is not None:
        denom = denom + sink_w
    with np.errstate(divide="ignore"):         # log(0) = -inf: the lse of a row that sees no key
        lse = _round(_f32((row_max + np.log(denom))[..., 0].transpose(0, 2, 1), low), low)   # (B, T, N)
    probs = _f32(np.divide(w, np.where(denom == 0, 1.0, denom), out=w), low)
    if low is not None:
        probs = _round(probs, low)              # probabilities in the dtype before P·V
    out = _round(_f32(_unrows(_pv(probs.reshape(B, K, -1, S), vg, low), T), low), low)
    q_keep = _kept_rows(p, B, T)
    empty = (denom[..., 0] == 0).transpose(0, 2, 1) & q_keep[:, :, None]                  # (B, T, N)
    if empty.any():                             # jax.nn's value there (``_empty_row_value``)
        out = np.where(empty[..., None], _round(_empty_row_value(vis, vg), low), out)
    out = out * q_keep[:, :, None, None]
    lse = np.where(q_keep[:, :, None], lse, -np.inf)
    sink_probs = None if sink is None else (sink_w / np.where(denom == 0, 1.0, denom))[..., 0]
    return _Forward(probs, out, q, kg, vg, sc, q_keep, p.out_shape, cap_slope, lse, empty, sink_probs)


def _window(local_window_size) -> tuple[int, int] | None:
    """jax.nn's reading of ``local_window_size``: an int w is (w, w), a pair is (left, right)."""
    if local_window_size is None:
        return None
    if np.ndim(local_window_size) == 0:
        return int(local_window_size), int(local_window_size)
    left, right = local_window_size
    return int(left), int(right)


def _kept_rows(p, B: int, T: int) -> np.ndarray:
    """(B, T) bool: the query rows that are not padding (inside query_seq_lengths, segment id >= 0)."""
    q_keep = np.ones((B, T), bool)
    if p.q_lengths is not None:
        q_keep = np.arange(T)[None, :] < np.asarray(p.q_lengths).reshape(B, 1)
    if p.q_segment_ids is not None:
        q_keep = q_keep & (np.asarray(p.q_segment_ids) >= 0)
    return q_keep


def _empty_row_value(vis, vg) -> np.ndarray:
    """(B, T, N, H) jax.nn's value of each row, were it to see no key: its masks give every hidden key one finite
    logit, so its softmax is uniform over the keys they hide (all S keys where they hide every one; where a -inf
    bias hides the visible keys, the hidden ones only); a row whose masks hide no key (a -inf bias on every key:
    NaN in jax.nn) gets the mean over all S keys. ``vis`` (B, N, T, S) bool, ``vg`` (B, K, S, H)."""
    B, N, T, S = vis.shape
    K = vg.shape[1]
    hidden = ~vis
    count = hidden.sum(axis=-1, keepdims=True)
    weights = np.where(count == 0, 1.0 / S, hidden / np.maximum(count, 1))          # (B, N, T, S)
    mean = np.einsum("bkgts,bksh->btkgh", weights.reshape(B, K, N // K, T, S), vg.astype(np.float64))
    return mean.reshape(B, T, N, -1)


def reference_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                        query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                        implementation=None, emulate=None, query_offset=0, query_positions=None,
                        logits_soft_cap=None, query_segment_ids=None, key_value_segment_ids=None,
                        return_residual=False, sinks=None):
    """Float64 attention with ``attnlab.attention``'s semantics; ``implementation`` is ignored.

    Returns an ndarray shaped like the output; with ``return_residual=True`` the pair (out, lse), lse
    (B, T, N) (or (T, N)): log sum_s exp(logits) over the keys the row sees, -inf where it sees none
    or is padding. A row that sees no key is given jax.nn's value: the mean of V over the keys its masks hide (all
    of them where they hide every key).

    ``logits_soft_cap``: logits = cap * tanh((scale * q.k + bias) / cap), then masking.
    ``query_segment_ids`` (B, T) / ``key_value_segment_ids`` (B, S): query t sees key s only when their
    ids are equal and >= 0; rows with a negative id give 0 (with sampled rows, pass their ids only).
    ``sinks`` (N,): one more logit per query head in each row's softmax denominator, with no value
    (gpt-oss); the lse includes it. A row that sees no key then gives 0 (all its weight on the sink)
    and its lse is the sink; a sink of -inf is the call without one.

    ``query_offset``: the given query rows sit at positions offset, offset+1, ... of a longer
    sequence; ``query_positions`` ((T,) or (B, T) ints) gives each row's position instead. Both
    are for checking a sample of rows of a large problem (no query_seq_lengths then).
    """
    del implementation
    if (query_offset or query_positions is not None) and query_seq_lengths is not None:
        raise ValueError("query_offset/query_positions cannot be combined with query_seq_lengths")
    f = _forward(query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                 query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
                 local_window_size=local_window_size, emulate=emulate, query_offset=query_offset,
                 query_positions=query_positions, logits_soft_cap=logits_soft_cap, sinks=sinks,
                 query_segment_ids=query_segment_ids, key_value_segment_ids=key_value_segment_ids)
    out = f.out.reshape(f.out_shape)
    return (out, f.lse.reshape(f.out_shape[:-1])) if return_residual else out


def reference_attention_grads(query, key, value, cotangent, bias=None, mask=None, *, scale=None,
                              is_causal=False, query_seq_lengths=None, key_value_seq_lengths=None,
                              local_window_size=None, logits_soft_cap=None, query_segment_ids=None,
                              key_value_segment_ids=None, sinks=None):
    """(dq, dk, dv) in float64 for the loss sum(out * cotangent), by the analytic backward pass
    (through the soft cap's tanh when ``logits_soft_cap`` is given); with ``sinks``, (dq, dk, dv, dsinks),
    dsinks (N,) = -sum over rows of p_sink * sum_s p_s dP_s (the sink has no value). A row that sees no key
    gives nothing to dv (the 0 output's gradient, naive's and flash-style kernels'), not that of jax.nn's mean of V
    there (its cotangent spread over the keys its masks hide): a check compares dv with the nearer of the two."""
    f = _forward(query, key, value, bias, mask, scale=scale, is_causal=is_causal,
                 query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
                 local_window_size=local_window_size, logits_soft_cap=logits_soft_cap, sinks=sinks,
                 query_segment_ids=query_segment_ids, key_value_segment_ids=key_value_segment_ids)
    if f.probs is None:                         # an empty call: its output is a constant
        return tuple(np.zeros(np.shape(x)) for x in (query, key, value) + (() if sinks is None else (sinks,)))
    B, T, N, H = f.out.shape
    K, S = f.k.shape[1], f.k.shape[2]
    k, v = _np(f.k), _np(f.v)
    dout = _rows(_np(cotangent).reshape(B, T, N, H) * f.q_keep[:, :, None, None], K)   # (B, K, G*T, H)
    probs = f.probs.reshape(B, K, -1, S)
    dv = probs.transpose(0, 1, 3, 2) @ dout                                            # (B, K, S, H)
    dprobs = dout @ v.transpose(0, 1, 3, 2)
    row_dot = np.sum(dprobs * probs, axis=-1, keepdims=True)                          # (B, K, G*T, 1)
    dlogits = probs * (dprobs - row_dot)
    if f.cap_slope is not None:
        dlogits = dlogits * f.cap_slope.reshape(dlogits.shape)
    dq = _unrows(dlogits @ k, T) * f.scale
    dk = dlogits.transpose(0, 1, 3, 2) @ _rows(f.q, K) * f.scale
    dk, dv = (x.transpose(0, 2, 1, 3) for x in (dk, dv))                              # (B, S, K, H)
    grads = dq.reshape(np.shape(query)), dk.reshape(np.shape(key)), dv.reshape(np.shape(value))
    if f.sink_probs is None:
        return grads
    return grads + (-(f.sink_probs * row_dot.reshape(B, N, T)).sum(axis=(0, 2)),)


def check_close(out, query, key, value, *args, tf32: bool | None = None, ref=None, limit: float | None = None,
                rule: str | None = None, baseline_err: float | None = None, return_residual: bool = False,
                **kwargs) -> Verdict:
    """Judge ``out`` against the float64 reference for these inputs by the tolerance policy.

    ``out`` must be shaped and typed exactly as ``attnlab.attention`` returns it (else
    ``OutputMismatchError``); with ``return_residual=True`` it is the pair (out, lse) and the lse is
    checked too. Both the relative L2 error and the worst row's relative error must pass; rows that
    see no key follow ``attnlab.reference.rules`` and the verdict's ``note`` says how they were
    compared. ``limit`` (with ``rule``, its words) replaces the dtype policy: FP8 paths use it.
    ``ref`` (the reference output) may be passed in when already computed for these inputs (then, for
    bfloat16/float16 without ``return_residual``, no second float64 pass is made).
    """
    if any(map(_is_tracer, (*(out if isinstance(out, (tuple, list)) else (out,)), query, key, value))):
        raise TypeError("check_close needs concrete arrays: call it outside jax.jit (it computes in NumPy float64)")
    if hasattr(query, "dtype"):                 # before the output's rules, which read the query's dtype
        common_float_dtype({"query": query})
    out, lse = rules.split_output(out, return_residual)
    shape = tuple(np.shape(query)[:-1]) + tuple(np.shape(value)[-1:])
    q_dtype = query.dtype if hasattr(query, "dtype") else np.asarray(query).dtype
    rules.require_like(out, "out", shape, q_dtype, "the query's, with the value's head dim")
    if lse is not None:
        rules.require_like(lse, "out[1] (lse)", shape[:-1], q_dtype, "the output's without its head dim")
    kwargs.pop("implementation", None)
    if rule is not None and limit is None:
        raise ValueError("check_close: rule= is the words of a given limit= (give both, or neither)")
    dtype, name = out.dtype, np.dtype(out.dtype).name
    emu = _forward(query, key, value, *args, emulate=dtype, **kwargs) if limit is None and name in _LOW else None
    # the float64 pass, unless a given ``ref`` and the emulation (rows that see no key) make it needless
    f = _forward(query, key, value, *args, **kwargs) if ref is None or lse is not None or emu is None else emu
    ref = f.out if ref is None else np.asarray(ref, np.float64).reshape(f.out.shape)
    o = np.asarray(out).astype(np.float64).reshape(f.out.shape)
    err, row, empty = rules.errors_past_empty_rows(o, ref, f.empty)
    lse_base = 0.0
    if limit is not None:
        row_limit = LIMIT_FACTOR * limit
    elif emu is not None:
        emu_target = rules.empty_row_target(emu.out, ref, f.empty).target
        base = rel_l2(emu.out, emu_target) if baseline_err is None else baseline_err
        limit, rule = tolerance(dtype, baseline_err=base)
        row_limit = policy_limit(dtype, row_rel_err(emu.out, emu_target))
        lse_base = rules.lse_error(emu.lse.astype(dtype), f.lse) if lse is not None else 0.0
    else:
        limit, rule = tolerance(dtype, baseline_err=baseline_err, tf32=tf32)
        row_limit = limit * 10 if name == "float32" and limit == TF32_LIMIT else limit
    ok = bool(err <= limit and row <= row_limit)
    lse_err = lse_limit = None
    if lse is not None:
        lse_err = rules.lse_error(np.asarray(lse).reshape(f.lse.shape), f.lse)
        lse_limit = 10 * TF32_LIMIT if limit == TF32_LIMIT else LIMIT_FACTOR * lse_base + rules.lse_floor(dtype)
        ok = ok and lse_err <= lse_limit
    max_abs = float(np.max(np.abs(o - empty.target))) if o.size else 0.0
    return Verdict(ok=ok, rel_err=err, limit=limit, max_abs_err=max_abs, rule=rule, row_err=row, row_limit=row_limit,
                   empty_rows=empty.rows, note=empty.note, lse_err=lse_err, lse_limit=lse_limit)
