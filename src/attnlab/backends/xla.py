"""XLA's attention: ``jax.nn.dot_product_attention(implementation="xla")``."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..spec import Prepared
from .base import Backend


def _lengths(x):
    return None if x is None else jnp.asarray(x, jnp.int32)


class XlaBackend(Backend):
    name = "xla"
    description = "jax.nn.dot_product_attention(implementation='xla'): XLA-fused einsum/softmax"
    portable = True

    def version(self) -> str | None:
        return jax.__version__

    def run(self, p: Prepared):
        return jax.nn.dot_product_attention(
            p.query, p.key, p.value, p.bias, p.mask, scale=p.scale, is_causal=p.spec.is_causal,
            query_seq_lengths=_lengths(p.q_lengths), key_value_seq_lengths=_lengths(p.kv_lengths),
            local_window_size=p.spec.window, implementation="xla",
        )
