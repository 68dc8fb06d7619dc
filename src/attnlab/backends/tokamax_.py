"""Google's tokamax kernels: ``tokamax.dot_product_attention(implementation="mosaic" | "triton")``.

tokamax has jax.nn's signature; an implementation that cannot run an input raises
``NotImplementedError``, which becomes ``UnsupportedError`` here (no fallback).
"""
from __future__ import annotations

import jax.numpy as jnp

from ..errors import UnsupportedError
from ..spec import AttentionSpec, Prepared
from . import _optional
from .base import Backend


class TokamaxBackend(Backend):
    def __init__(self, impl: str):
        self.impl = impl
        self.name = f"tokamax-{impl}"
        self.description = f"tokamax.dot_product_attention(implementation='{impl}') (Pallas {impl} GPU kernel)"

    def available(self) -> str | None:
        return _optional.missing("tokamax", "tokamax") or _optional.needs_nvidia((9, 0) if self.impl == "mosaic" else (8, 0))

    def version(self) -> str | None:
        return _optional.dist_version("tokamax")

    def supports(self, spec: AttentionSpec) -> str | None:
        if spec.dtype not in ("float16", "bfloat16") and self.impl == "mosaic":
            return f"dtype {spec.dtype} not supported by the Mosaic GPU kernel (float16/bfloat16)"
        return None

    def run(self, p: Prepared):
        import tokamax

        ln = lambda x: None if x is None else jnp.asarray(x, jnp.int32)  # noqa: E731
        try:
            return tokamax.dot_product_attention(
                p.query, p.key, p.value, p.bias, p.mask, scale=p.scale, is_causal=p.spec.is_causal,
                query_seq_lengths=ln(p.q_lengths), key_value_seq_lengths=ln(p.kv_lengths),
                local_window_size=p.spec.window, implementation=self.impl)
        except NotImplementedError as e:
            raise UnsupportedError(self.name, str(e) or type(e).__name__) from e
        except ExceptionGroup as e:  # tokamax groups the reasons of every implementation it tried
            raise UnsupportedError(self.name, "; ".join(str(x) for x in e.exceptions)) from e
