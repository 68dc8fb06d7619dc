"""Google's tokamax kernels: ``tokamax.dot_product_attention(implementation="mosaic" | "triton")``.

tokamax has jax.nn's signature; an implementation that cannot run an input raises
``NotImplementedError``, which becomes ``UnsupportedError`` here (no fallback). Output rows past
``query_seq_lengths`` are zeroed here, as jax.nn does (tokamax leaves them as computed).
"""
from __future__ import annotations

import jax.numpy as jnp

from ..core import device
from ..core.call import Call
from ..core.errors import UnsupportedError
from .base import Backend, segments_as_mask, zero_padded_queries
from .xla import NO_F16_PLATFORMS


class TokamaxBackend(Backend):
    def __init__(self, impl: str):
        self.impl = impl
        # tokamax's XLA path runs anywhere JAX does; the Mosaic GPU kernel needs Hopper
        self.min_compute_capability = None if impl == "xla" else (9, 0) if impl == "mosaic" else (8, 0)
        self.name = f"tokamax-{impl}"
        # tokamax's XLA path is timed forward only, beside the kernels
        self.peer_parts = ("fwd",) if impl == "xla" else ("fwd", "train", "decode", "auto")
        kind = "XLA" if impl == "xla" else f"Pallas {impl} GPU kernel"
        self.description = f"tokamax.dot_product_attention(implementation='{impl}') ({kind})"

    library = ("tokamax", "tokamax")
    takes_soft_cap = True        # tokamax's logits_soft_cap: cap * tanh((scale q.k + bias) / cap), then masks
    takes_segment_ids = True     # as a dense (B, 1, T, S) mask: tokamax's API takes no segment ids

    def available(self) -> str | None:
        return self.library_missing() or super().available()   # the library first, then the device

    def supports(self, spec: Call) -> str | None:
        if spec.dtype not in ("float16", "bfloat16") and self.impl == "mosaic":
            return f"dtype {spec.dtype} not supported by the Mosaic GPU kernel (float16/bfloat16)"
        if spec.window is not None and spec.q_len != spec.kv_len:
            # tokamax's API builds the window from the key positions alone: an (S, S) mask against (T, S) logits
            # (tokamax 0.0.12: a broadcasting error inside its _fwd)
            return f"local_window_size with T != S ({spec.q_len} != {spec.kv_len}): tokamax places the window by key index"
        if spec.dtype == "float16" and self.impl == "xla" and device.current().platform in NO_F16_PLATFORMS:
            return (f"float16 on {device.current().platform}: tokamax asks for a float16 dot with float32 accumulation "
                    "(F16_F16_F32), which this platform's dot_general lacks")
        return None

    def run(self, p: Call):
        import tokamax  # optional: tokamax
        from absl import flags  # optional: absl comes with tokamax, not with attnlab's own dependencies

        if not flags.FLAGS.is_parsed():
            # tokamax reads absl flags; unparsed, absl would parse the host program's argv (pytest's, a CLI's).
            flags.FLAGS.mark_as_parsed()

        p = segments_as_mask(p)
        ln = lambda x: None if x is None else jnp.asarray(x, jnp.int32)  # noqa: E731
        arr = lambda x: None if x is None else jnp.asarray(x)  # noqa: E731  (tokamax's type checks refuse NumPy)
        try:
            out = tokamax.dot_product_attention(
                *map(arr, (p.query, p.key, p.value, p.bias, p.mask)), scale=p.scale, is_causal=p.is_causal,
                query_seq_lengths=ln(p.q_lengths), key_value_seq_lengths=ln(p.kv_lengths),
                local_window_size=p.window, logits_soft_cap=p.soft_cap, implementation=self.impl)
        except NotImplementedError as e:
            raise UnsupportedError(self.name, str(e) or type(e).__name__) from e
        except ExceptionGroup as e:  # tokamax groups the reasons of every implementation it tried
            raise UnsupportedError(self.name, "; ".join(str(x) for x in e.exceptions)) from e
        # tokamax leaves output rows past query_seq_lengths unzeroed (seen with tokamax 0.0.12's XLA
        # path on 2026-12-02); jax.nn zeroes them, and so does attnlab.
        return zero_padded_queries(out, p)
