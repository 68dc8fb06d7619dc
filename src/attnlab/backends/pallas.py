"""JAX's own Pallas GPU kernels: the Triton FlashAttention (``mha``) and the Mosaic GPU FA3 kernel."""
from __future__ import annotations

import jax.numpy as jnp

from ..core.call import Call
from . import _optional
from .base import Backend


class PallasTritonBackend(Backend):
    name = "pallas-triton"
    peer_parts = ("fwd", "train", "auto")
    description = "jax.experimental.pallas.ops.gpu.attention.mha (Pallas Triton FlashAttention-2)"
    block = 128

    library = ("jax.experimental.pallas.ops.gpu.attention", "cuda13")
    min_compute_capability = (8, 0)

    def supports(self, spec: Call) -> str | None:
        if spec.dtype not in ("float16", "bfloat16", "float32"):
            return f"dtype {spec.dtype} not supported"
        if spec.kv_heads != spec.heads:
            return f"needs as many key/value heads as query heads (K={spec.kv_heads}, N={spec.heads})"
        for name, n in (("T", spec.q_len), ("S", spec.kv_len)):
            if n % min(self.block, n):
                return f"{name}={n} must be a multiple of the block size {self.block}"
        return _optional.simple_masks_only(spec, "pallas-triton")

    def run(self, p: Call):
        from jax.experimental.pallas.ops.gpu import attention as pl_attention  # heavy: Pallas, not at CLI start

        return pl_attention.mha(p.query, p.key, p.value, None, sm_scale=float(p.scale), causal=p.is_causal)


class PallasMosaicBackend(Backend):
    name = "pallas-mosaic"
    peer_parts = ("fwd16",)     # float16 only
    description = "jax.experimental.pallas.ops.gpu.attention_mgpu (Pallas Mosaic GPU FlashAttention-3, Hopper)"
    block_q, block_kv = 64, 128

    library = ("jax.experimental.pallas.ops.gpu.attention_mgpu", "cuda13")
    min_compute_capability = (9, 0)

    def supports(self, spec: Call) -> str | None:
        if spec.dtype != "float16":
            return f"dtype {spec.dtype} not supported (the kernel takes float16 only)"
        if spec.head_dim % 64 or spec.head_dim > 256:
            return f"head dim {spec.head_dim} must be a multiple of 64 and <= 256"
        if spec.is_causal and spec.q_len != spec.kv_len:
            return f"causal needs T == S, got T={spec.q_len}, S={spec.kv_len}"
        if spec.q_len % (2 * self.block_q):
            return f"T={spec.q_len} must be a multiple of {2 * self.block_q}"
        if spec.kv_len % self.block_kv:
            return f"S={spec.kv_len} must be a multiple of {self.block_kv}"
        return _optional.simple_masks_only(spec, "pallas-mosaic")

    def mode_reason(self, spec: Call, mode: str) -> str | None:
        if mode != "fwd" and spec.is_causal:
            return "its backward pass has no causal mode"
        return None

    def run(self, p: Call):
        from jax.experimental.pallas.ops.gpu import attention_mgpu as mgpu  # heavy: Pallas, not at CLI start

        cfg = mgpu.TuningConfig(block_q=self.block_q, block_kv=self.block_kv, max_concurrent_steps=2,
                                causal=p.is_causal, block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
        q = (p.query.astype(jnp.float32) * p.scale).astype(p.query.dtype)  # the kernel applies no scale
        return mgpu.attention(q, p.key, p.value, cfg)
