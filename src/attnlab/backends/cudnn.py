"""cuDNN fused (flash) attention through ``jax.nn.dot_product_attention(implementation="cudnn")``.

``supports`` refuses, with the reason, every input where cuDNN cannot run or has been
reported to return silently wrong results; auto-selection then picks another backend.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..core import device
from ..core.call import Call
from . import cudnn_packed
from .base import Backend
from .cudnn_paged import run_paged_decode
from .xla import residual_reason

CUDNN_MARKER = "__cudnn$fmha"


class CudnnBackend(Backend):
    name = "cudnn"
    peer_parts = ("quick", "fwd", "fwd16", "train", "decode", "fp8", "auto")
    description = "cuDNN flash attention via jax.nn.dot_product_attention(implementation='cudnn')"
    #: jax.nn's cuDNN path returns cuDNN's softmax statistics as the (B, T, N) residual (in the output
    #: dtype); its backward ignores the residual's cotangent, as the XLA path's stop_gradient does.
    residual = True
    min_compute_capability = (8, 0)   # checked below with cuDNN's own messages (and cuDNN loaded)
    #: packed segments through JAX's private packed entry point (``cudnn_packed``)
    takes_segment_ids = True
    paged = True   # run_paged_decode: cuDNN's own paged attention
    soft_cap_reason = "logits_soft_cap: cuDNN through JAX (jax.nn and the fused entry point) takes no soft cap"
    sinks_reason = "sinks: cuDNN through JAX (jax.nn and the fused entry point) has no attention sinks"

    def available(self) -> str | None:
        info = device.current()
        if info.platform != "gpu":
            return f"needs an NVIDIA GPU; JAX's default device is {info.platform} ({info.kind})"
        if info.compute_capability is None:
            return f"needs an NVIDIA GPU with a CUDA compute capability; device is {info.kind}"
        if info.compute_capability < (8, 0):
            cc = ".".join(map(str, info.compute_capability))
            return f"needs compute capability >= 8.0 (Ampere), device has {cc}"
        if info.cudnn_version is None:
            return "cuDNN library not detected by jaxlib"
        return None

    def version(self) -> str | None:
        return device.current().cudnn_version_str if device.current().platform == "gpu" else None

    def supports(self, spec: Call) -> str | None:
        if spec.dtype not in ("float16", "bfloat16"):
            return f"dtype {spec.dtype} not supported (needs float16 or bfloat16)"
        cc = device.current().compute_capability
        h_max = 256 if cc is None or cc >= (9, 0) else 128
        if spec.head_dim > h_max:
            return f"head dim {spec.head_dim} > {h_max}"
        if spec.head_dim % 8:
            return f"head dim {spec.head_dim} is not a multiple of 8"
        if spec.window is not None and not spec.is_causal:
            # jax-ml/jax#39576: without a causal mask, JAX hands cuDNN only the left edge of the
            # window, and every query attends to its whole future.
            return "local_window_size without is_causal attends to future keys (jax-ml/jax#39576)"
        if spec.return_residual and _odd_masked(spec):
            return (f"return_residual runs JAX's cuDNN training kernel, where {_odd_masked(spec)}")
        if spec.has_segment_ids:
            if cc is not None and cc < (9, 0):
                return "segment ids: JAX's packed cuDNN layout needs Hopper (compute capability >= 9.0)"
            why = cudnn_packed.refusal(spec)
            if why:
                return why
        return residual_reason(spec)

    def mode_reason(self, spec: Call, mode: str) -> str | None:
        """A forward call with a bias or mask runs at odd T or S; only the backward pass refuses it."""
        if mode != "fwd" and _odd_masked(spec):
            return f"backward pass: {_odd_masked(spec)}"
        return super().mode_reason(spec, mode)

    def run_paged_decode(self, d, mask):
        """``decode_attention`` with a page table: cuDNN's own paged attention (``cudnn_paged``)."""
        return run_paged_decode(self, d, mask)

    def run(self, p: Call):
        if p.has_segment_ids:
            return cudnn_packed.run(p)
        window = None
        if p.window is not None:
            # Under a causal mask the right edge is already 0; cuDNN takes only the left edge.
            window = (p.window[0], 0)
        # cuDNN takes bias (and the mask, which JAX turns into a bias) over the full (T, S).
        full = lambda x: None if x is None else jnp.broadcast_to(x, x.shape[:2] + (p.q_len, p.kv_len))
        bias, mask = full(p.bias), full(p.mask)
        q_lengths = None if p.q_lengths is None else jnp.asarray(p.q_lengths, jnp.int32)
        kv_lengths = None if p.kv_lengths is None else jnp.asarray(p.kv_lengths, jnp.int32)
        extra = {"return_residual": True} if p.return_residual else {}
        return jax.nn.dot_product_attention(
            p.query, p.key, p.value, bias, mask, scale=p.scale, is_causal=p.is_causal,
            query_seq_lengths=q_lengths, key_value_seq_lengths=kv_lengths,
            local_window_size=window, implementation="cudnn", **extra,
        )


def _odd_masked(spec: Call) -> str | None:
    """JAX's cuDNN rule (``check_is_flash_attention``, is_training only): a bias or mask needs even T and S."""
    if (spec.bias_shape or spec.mask_shape) and (spec.q_len % 2 or spec.kv_len % 2):
        return f"a bias or mask needs even sequence lengths (T % 2 == 0 and S % 2 == 0), got T={spec.q_len}, S={spec.kv_len}"
    return None


def hlo_uses_cudnn(fn, *args, **kwargs) -> bool:
    """True when ``jax.jit(fn)`` lowered on these arguments calls cuDNN's fused attention."""
    text = jax.jit(fn).lower(*args, **kwargs).as_text()
    return CUDNN_MARKER in text
