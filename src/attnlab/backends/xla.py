"""XLA's attention: ``jax.nn.dot_product_attention(implementation="xla")``."""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp

from ..spec import AttentionSpec, Prepared
from .base import Backend

#: Whether the installed jax.nn.dot_product_attention takes return_residual.
JAX_HAS_RESIDUAL = "return_residual" in inspect.signature(jax.nn.dot_product_attention).parameters


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
        return residual_reason(spec)

    def run(self, p: Prepared):
        extra = {"return_residual": True} if p.spec.return_residual else {}
        return jax.nn.dot_product_attention(
            p.query, p.key, p.value, p.bias, p.mask, scale=p.scale, is_causal=p.spec.is_causal,
            query_seq_lengths=_lengths(p.q_lengths), key_value_seq_lengths=_lengths(p.kv_lengths),
            local_window_size=p.spec.window, implementation="xla", **extra,
        )
