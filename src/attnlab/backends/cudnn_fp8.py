"""cuDNN's FP8 flash attention through JAX's private API (forward only).

``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention(..., use_fp8=True,
fp8_params=...)`` takes q, k, v in float8_e4m3fn with per-tensor descale factors and returns
the output in float8_e4m3fn. This backend takes bf16/fp16 inputs, quantises each of q, k, v
with its own amax scale (``cudnn-fp8``) or with unit scales as JAX's own tests do
(``cudnn-fp8-unit``), scales the softmax probabilities into e4m3's range, and dequantises
the output back to the input dtype. It is a private API: it is guarded by feature checks and
raises ``UnsupportedError`` where they fail.
"""
from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp

from .. import device
from ..spec import AttentionSpec, Prepared
from .cudnn import CudnnBackend

E4M3_MAX = 448.0
FP8_KEYS = ("amax_dQ", "amax_dK", "amax_dV", "amax_dP", "descale_q", "descale_k", "descale_v", "descale_s",
            "scale_s", "scale_o", "descale_o", "descale_dO", "descale_dP", "scale_dQ", "scale_dK", "scale_dV", "scale_dP")


@functools.lru_cache(maxsize=None)
def _private_api():
    """(module, reason): JAX's cuDNN fused-attention module if it has the FP8 entry point."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa
    except Exception as e:  # noqa: BLE001
        return None, f"jax._src.cudnn.fused_attention_stablehlo cannot be imported ({type(e).__name__})"
    fn = getattr(fa, "dot_product_attention", None)
    if fn is None:
        return None, "JAX's private cuDNN module has no dot_product_attention"
    params = inspect.signature(fn).parameters
    if "use_fp8" not in params or "fp8_params" not in params:
        return None, f"JAX {jax.__version__}'s private cuDNN dot_product_attention has no use_fp8/fp8_params"
    if not hasattr(fa, "MaskType") or not hasattr(jnp, "float8_e4m3fn"):
        return None, "JAX lacks MaskType or float8_e4m3fn"
    return fa, None


def _amax_scale(x):
    amax = jnp.max(jnp.abs(x.astype(jnp.float32)))
    return E4M3_MAX / jnp.maximum(amax, 1e-12)


def _quantise(x, scale):
    y = jnp.clip(x.astype(jnp.float32) * scale, -E4M3_MAX, E4M3_MAX)
    return y.astype(jnp.float8_e4m3fn)


class CudnnFp8Backend(CudnnBackend):
    name = "cudnn-fp8"
    description = "cuDNN FP8 (e4m3) flash attention via JAX's private API, per-tensor amax scaling"
    forward_only = True
    unit_scales = False
    rel_l2_limit = 0.1
    rel_l2_rule = "float8 e4m3 inside: rel L2 <= 0.1, worst row <= 0.2"
    compute_dtype = "float8_e4m3fn"
    min_compute_capability = (9, 0)

    def available(self) -> str | None:
        why = super().available()   # an NVIDIA GPU >= sm80 with cuDNN loaded
        if why:
            return why
        info = device.current()
        if info.compute_capability < self.min_compute_capability:
            return f"FP8 attention needs compute capability >= 9.0 (Hopper), device has {info.compute_capability}"
        if info.cudnn_version == 91000:
            return "cuDNN 9.10.0 does not support SDPA FP8"
        _, why = _private_api()
        return why

    def supports(self, spec: AttentionSpec) -> str | None:
        if spec.dtype not in ("float16", "bfloat16"):
            return f"dtype {spec.dtype} not supported (takes float16/bfloat16, computes in float8_e4m3fn)"
        if spec.head_dim > 256 or spec.head_dim % 16:
            return f"head dim {spec.head_dim} must be <= 256 and a multiple of 16 for FP8"
        if spec.kv_heads != spec.heads:
            return "grouped key/value heads (K != N) are not exercised by JAX's FP8 path"
        if spec.bias_shape or spec.mask_shape or spec.has_q_lengths or spec.has_kv_lengths or spec.window:
            return "FP8 attention takes no bias, mask, sequence lengths or window (causal or none only)"
        return None

    def run(self, p: Prepared):
        fa, _ = _private_api()
        q, k, v = p.query, p.key, p.value
        if self.unit_scales:
            sq = sk = sv = jnp.float32(1.0)
            ss = so = jnp.float32(1.0)
        else:
            sq, sk, sv = _amax_scale(q), _amax_scale(k), _amax_scale(v)
            ss = jnp.float32(E4M3_MAX)   # softmax probabilities lie in [0, 1]
            so = sv                      # |out| <= max |v|: the output shares v's scale
        one = jnp.ones((1, 1, 1, 1), jnp.float32)
        params = {n: one for n in FP8_KEYS}
        params.update(descale_q=one / sq, descale_k=one / sk, descale_v=one / sv, descale_s=one / ss,
                      scale_s=one * ss, scale_o=one * so)
        mask_type = fa.MaskType.CAUSAL if p.spec.is_causal else fa.MaskType.NO_MASK
        out8, _, _ = fa.dot_product_attention(
            _quantise(q, sq), _quantise(k, sk), _quantise(v, sv), fp8_params=params,
            scale=float(p.scale), mask_type=mask_type, qkv_layout="BTNH", use_fp8=True)
        return (out8.astype(jnp.float32) / so).astype(q.dtype)


class CudnnFp8UnitBackend(CudnnFp8Backend):
    name = "cudnn-fp8-unit"
    description = "cuDNN FP8 attention with unit scales (as JAX's own tests call it)"
    unit_scales = True
