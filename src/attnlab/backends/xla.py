"""XLA's attention: ``jax.nn.dot_product_attention(implementation="xla")``.

float16 on a CPU (or TPU): jax.nn asks XLA for a float16 dot with float32 accumulation
(``DotAlgorithmPreset.F16_F16_F32``), which the CPU's dot_general lacks: called eagerly jax.nn
catches the error and retries at default precision, but under ``jax.jit`` compilation fails ("The
precision 'F16_F16_F32' is not supported by dot_general on CPU"; measured with JAX 0.10.2; JAX 0.12.1 runs it). TPUs
lack it too (jax.nn's own comment). Here the inputs are cast to float32, jax.nn runs at a precision
the platform has, and the output (and residual) are cast back to float16: the same arithmetic as
F16_F16_F32 (float16 operands are exact in float32, the accumulation is float32), eager and under
``jax.jit``, and gradients flow back through the casts in float16.

Packed segments run as a dense (B, 1, T, S) mask (exact; memory O(B T S)). ``sinks`` (jax.nn has none) run
as one more key: a zero key and value whose logit is the sink (a bias column), every other rule folded into
a dense (B, N, T, S + 1) mask (memory O(B N T S)). ``logits_soft_cap`` is
refused: jax.nn's fused softmax leaves no place to apply the tanh.
"""
from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp

from ..core import device
from ..core.call import Call
from ..core.masking import large_negative_value
from .base import Backend, query_keep, segments_as_mask
from .masked_decode import contiguous_kv
from .masked_serving import masked_serving
from .naive import visible_mask

#: Whether the installed jax.nn.dot_product_attention takes return_residual.
JAX_HAS_RESIDUAL = "return_residual" in inspect.signature(jax.nn.dot_product_attention).parameters
#: Platforms whose dot_general lacks jax.nn's float16 precision F16_F16_F32 (CPU measured; TPU per jax.nn).
NO_F16_PLATFORMS = ("cpu", "tpu")


def _upcast(dtype, T: int, S: int) -> bool:
    """Whether jax.nn gets float32 copies (exact) and the output goes back to ``dtype``: float16 where the platform
    has no F16_F16_F32 dot; bfloat16 with one query and one key on the CPU, whose compiler refuses jax.nn's
    BF16_BF16_F32 1x1 logits dot under jit (jax 0.10.2: "Algorithm not supported by the ElementalIrEmitter";
    jax.nn's own call fails so)."""
    platform = device.current().platform
    return ((dtype == jnp.float16 and platform in NO_F16_PLATFORMS)
            or (dtype == jnp.bfloat16 and T == S == 1 and platform == "cpu"))


def _lengths(x):
    return None if x is None else jnp.asarray(x, jnp.int32)


def residual_reason(spec: Call) -> str | None:
    """Why jax.nn cannot give the logsumexp residual here (an older JAX), or None."""
    if spec.return_residual and not JAX_HAS_RESIDUAL:
        return f"return_residual needs jax.nn.dot_product_attention(return_residual=...), absent in jax {jax.__version__}"
    return None


class XlaBackend(Backend):
    name = "xla"
    peer_parts = ("quick", "fwd", "train", "decode", "auto")
    description = "jax.nn.dot_product_attention(implementation='xla'): XLA-fused einsum/softmax"
    portable = True
    residual = True
    takes_segment_ids = True
    takes_sinks = True
    takes_any_scale = True
    takes_decode_window = True     # the masked decode path folds the window into its mask
    takes_kv_scales = True      # decode / serving: the masked path dequantizes the cache in float32
    soft_cap_reason = ("logits_soft_cap: jax.nn.dot_product_attention has no soft cap, and its fused softmax "
                       "leaves no place to apply cap * tanh(logits / cap) exactly")

    def version(self) -> str | None:
        return jax.__version__

    def supports(self, spec: Call) -> str | None:
        if spec.dtype == "float64":
            # jax/_src/nn/functions.py: "Softmax and it is always carried out in fp32"
            return ("float64: jax.nn computes the softmax in float32, so the output is only float32-accurate "
                    "(rel err ~1e-7, not float64's 1e-10); naive computes in float64")
        return residual_reason(spec)

    def supports_serving(self, spec) -> str | None:
        return None   # the masked jax.numpy path (``backends.masked_serving``), any platform

    def run_serving(self, call):
        k, v = contiguous_kv(call, call.q.dtype)
        return masked_serving(call.q, k, v, call.q_starts, call.kv_lengths, scale=call.scale,
                              soft_cap=call.soft_cap, sinks=call.sinks, window=call.problem.window)

    def run(self, p: Call):
        if p.sinks is not None:
            return _run_with_sinks(p)
        p = segments_as_mask(p)
        extra = {"return_residual": True} if p.return_residual else {}
        dtype = p.query.dtype
        up = _upcast(dtype, int(p.query.shape[1]), int(p.key.shape[1]))
        cast = (lambda x: None if x is None else x.astype(jnp.float32)) if up else (lambda x: x)  # noqa: E731
        out = jax.nn.dot_product_attention(
            cast(p.query), cast(p.key), cast(p.value), p.bias if p.bias is None or not up else cast(p.bias), p.mask,
            scale=p.scale, is_causal=p.is_causal,
            query_seq_lengths=_lengths(p.q_lengths), key_value_seq_lengths=_lengths(p.kv_lengths),
            local_window_size=p.window, implementation="xla", **extra,
        )
        out, lse = out if p.return_residual else (out, None)
        if p.q_segment_ids is not None:
            # jax.nn gives rows that see no key the mean of the values; padding segments give 0
            keep = query_keep(p)
            out = jnp.where(keep[:, :, None, None], out, 0).astype(out.dtype)
            if lse is not None:
                lse = jnp.where(keep[:, :, None], lse, jnp.asarray(large_negative_value(lse.dtype), lse.dtype))
        out = out.astype(dtype)
        return out if lse is None else (out, lse.astype(dtype))


def _sink_column(p: Call) -> Call:
    """``p`` with the sinks as key S: zero key and value rows, the sink as its bias (so its logit is the sink,
    whatever the scale), visible to every row; causality, window, lengths, mask and segments become one
    dense (B or 1, N or 1, T, S + 1) mask. Query lengths stay (padded rows are zeroed by the caller)."""

    B, T, N, H = p.query.shape
    vis = visible_mask(p)                                  # broadcastable to (B, K, G, T, S)
    vis = jnp.broadcast_to(vis, vis.shape[:3] + (T, p.kv_len))
    vis = vis.reshape((vis.shape[0], vis.shape[1] * vis.shape[2], T, p.kv_len))
    mask = jnp.concatenate([vis, jnp.ones(vis.shape[:3] + (1,), bool)], axis=-1)
    base = jnp.zeros((1, 1, 1, p.kv_len), jnp.float32) if p.bias is None else p.bias.astype(jnp.float32)
    lead = (base.shape[0], N, base.shape[2])
    sink = jnp.broadcast_to(p.sinks.astype(jnp.float32).reshape(1, N, 1, 1), lead + (1,))
    bias = jnp.concatenate([jnp.broadcast_to(base, lead + (p.kv_len,)), sink], axis=-1)
    zero = jnp.zeros((B, 1, p.kv_heads, H), p.key.dtype)
    key, value = (jnp.concatenate([x, zero], axis=1) for x in (p.key, p.value))
    problem = dataclasses.replace(p.problem, kv_len=p.kv_len + 1, causal=False, window=None)
    return dataclasses.replace(p, problem=problem, key=key, value=value, bias=bias, mask=mask, kv_lengths=None,
                               bias_shape=tuple(bias.shape), mask_shape=tuple(mask.shape), has_kv_lengths=False,
                               has_segment_ids=False, has_sinks=False, q_segment_ids=None, kv_segment_ids=None,
                               sinks=None)


def _run_with_sinks(p: Call):
    """jax.nn on ``_sink_column(p)``; rows t >= query_seq_lengths and padding segments give 0 (lse: jax.nn's
    masked-logit value). A row that sees no key puts all its weight on the sink: it gives 0, lse = sink."""
    keep = query_keep(p)
    res = XlaBackend().run(_sink_column(p))
    out, lse = res if p.return_residual else (res, None)
    if keep is not None:
        out = jnp.where(keep[:, :, None, None], out, 0).astype(out.dtype)
        if lse is not None:
            lse = jnp.where(keep[:, :, None], lse, jnp.asarray(large_negative_value(lse.dtype), lse.dtype))
    return out if lse is None else (out, lse)
