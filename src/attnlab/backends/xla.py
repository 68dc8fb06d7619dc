"""XLA's attention: ``jax.nn.dot_product_attention(implementation="xla")``.

Capability: float16 runs on GPUs only. jax.nn asks XLA for a float16 dot with float32 accumulation
(``DotAlgorithmPreset.F16_F16_F32``), which the CPU's dot_general lacks: called eagerly jax.nn
catches the error and retries at default precision, but under ``jax.jit`` compilation fails ("The
precision 'F16_F16_F32' is not supported by dot_general on CPU"; measured with JAX 0.10.2). TPUs
lack it too (jax.nn's own comment). ``supports`` refuses float16 there, so auto runs ``naive`` and
a sweep cell is recorded ``unsupported`` with that reason rather than ``compile_error``.
"""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp

from .. import device
from ..spec import AttentionSpec, Prepared
from .base import Backend

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

    def version(self) -> str | None:
        return jax.__version__

    def supports(self, spec: AttentionSpec) -> str | None:
        platform = device.current().platform
        if spec.dtype == "float16" and platform in NO_F16_PLATFORMS:
            return (f"float16 on {platform}: XLA's dot_general there has no F16_F16_F32 precision, "
                    "which jax.nn's float16 path needs under jit")
        if spec.dtype == "float64":
            # jax/_src/nn/functions.py: "Softmax and it is always carried out in fp32"
            return ("float64: jax.nn computes the softmax in float32, so the output is only float32-accurate "
                    "(rel err ~1e-7, not float64's 1e-10); naive computes in float64")
        return residual_reason(spec)

    def run(self, p: Prepared):
        extra = {"return_residual": True} if p.spec.return_residual else {}
        return jax.nn.dot_product_attention(
            p.query, p.key, p.value, p.bias, p.mask, scale=p.scale, is_causal=p.spec.is_causal,
            query_seq_lengths=_lengths(p.q_lengths), key_value_seq_lengths=_lengths(p.kv_lengths),
            local_window_size=p.spec.window, implementation="xla", **extra,
        )
