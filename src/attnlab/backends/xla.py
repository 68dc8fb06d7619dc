"""XLA's attention: ``jax.nn.dot_product_attention(implementation="xla")``.

float16 on a CPU (or TPU): jax.nn asks XLA for a float16 dot with float32 accumulation
(``DotAlgorithmPreset.F16_F16_F32``), which the CPU's dot_general lacks: called eagerly jax.nn
catches the error and retries at default precision, but under ``jax.jit`` compilation fails ("The
precision 'F16_F16_F32' is not supported by dot_general on CPU"; measured with JAX 0.10.2). TPUs
lack it too (jax.nn's own comment). Here the inputs are cast to float32, jax.nn runs at a precision
the platform has, and the output (and residual) are cast back to float16: the same arithmetic as
F16_F16_F32 (float16 operands are exact in float32, the accumulation is float32), eager and under
``jax.jit``, and gradients flow back through the casts in float16.

Packed segments run as a dense (B, 1, T, S) mask (exact; memory O(B T S)). ``logits_soft_cap`` is
refused: jax.nn's fused softmax leaves no place to apply the tanh.
"""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp

from ..core import device
from ..core.spec import AttentionSpec, Prepared
from ..core.masking import large_negative_value
from .base import Backend, query_keep, segments_as_mask

#: Whether the installed jax.nn.dot_product_attention takes return_residual.
JAX_HAS_RESIDUAL = "return_residual" in inspect.signature(jax.nn.dot_product_attention).parameters
#: Platforms whose dot_general lacks jax.nn's float16 precision F16_F16_F32 (CPU measured; TPU per jax.nn).
NO_F16_PLATFORMS = ("cpu", "tpu")


def _lengths(x):
    return None if x is None else jnp.asarray(x, jnp.int32)


def residual_reason(spec: AttentionSpec) -> str | None:
    """Why jax.nn cannot give the logsumexp residual here (an older JAX), or None."""
    if spec.return_residual and not JAX_HAS_RESIDUAL:
        return f"return_residual needs jax.nn.dot_product_attention(return_residual=...), absent in jax {jax.__version__}"
    return None


class XlaBackend(Backend):
    name = "xla"
    description = "jax.nn.dot_product_attention(implementation='xla'): XLA-fused einsum/softmax"
    portable = True
    residual = True
    takes_segment_ids = True
    soft_cap_reason = ("logits_soft_cap: jax.nn.dot_product_attention has no soft cap, and its fused softmax "
                       "leaves no place to apply cap * tanh(logits / cap) exactly")

    def version(self) -> str | None:
        return jax.__version__

    def supports(self, spec: AttentionSpec) -> str | None:
        if spec.dtype == "float64":
            # jax/_src/nn/functions.py: "Softmax and it is always carried out in fp32"
            return ("float64: jax.nn computes the softmax in float32, so the output is only float32-accurate "
                    "(rel err ~1e-7, not float64's 1e-10); naive computes in float64")
        return residual_reason(spec)

    def supports_serving(self, spec) -> str | None:
        return None     # the masked jax.numpy path (``backends.masked_serving``), any platform

    def run_serving(self, call):
        from .masked_serving import masked_serving

        k, v = call.contiguous()
        return masked_serving(call.q, k, v, call.q_starts, call.kv_lengths, scale=call.scale,
                              soft_cap=call.spec.soft_cap)

    def run(self, p: Prepared):
        p = segments_as_mask(p)
        extra = {"return_residual": True} if p.spec.return_residual else {}
        dtype = p.query.dtype
        up = dtype == jnp.float16 and device.current().platform in NO_F16_PLATFORMS
        cast = (lambda x: None if x is None else x.astype(jnp.float32)) if up else (lambda x: x)  # noqa: E731
        out = jax.nn.dot_product_attention(
            cast(p.query), cast(p.key), cast(p.value), p.bias if p.bias is None or not up else cast(p.bias), p.mask,
            scale=p.scale, is_causal=p.spec.is_causal,
            query_seq_lengths=_lengths(p.q_lengths), key_value_seq_lengths=_lengths(p.kv_lengths),
            local_window_size=p.spec.window, implementation="xla", **extra,
        )
        out, lse = out if p.spec.return_residual else (out, None)
        if p.q_segment_ids is not None:
            # jax.nn gives rows that see no key the mean of the values; padding segments give 0
            keep = query_keep(p)
            out = jnp.where(keep[:, :, None, None], out, 0).astype(out.dtype)
            if lse is not None:
                lse = jnp.where(keep[:, :, None], lse, jnp.asarray(large_negative_value(lse.dtype), lse.dtype))
        out = out.astype(dtype)
        return out if lse is None else (out, lse.astype(dtype))
