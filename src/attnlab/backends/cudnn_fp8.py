"""cuDNN's FP8 flash attention through JAX's private API (forward only); the FP8 recipe is an option.

One backend is registered, ``cudnn-fp8`` (the amax recipe); each recipe is a configured variant of it,
reached as ``cudnn-fp8-<recipe>`` (``backends.get``, ``implementation=``, sweeps' ``--fp8-recipe``), the
name its records carry as before, with the recipe in ``facts.fp8_recipe``.

``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention(..., use_fp8=True,
fp8_params=...)`` takes q, k, v in float8_e4m3fn with per-tensor descale factors and returns
the output in float8_e4m3fn. This backend takes bf16/fp16 q (B, T, N, H), k, v (B, S, N, H),
applies its recipe (``attnlab.backends.fp8_recipe``: scales, the P scale, a Hadamard rotation of q
and k, K smoothing), quantises q, k, v to e4m3, scales the softmax probabilities into e4m3's range,
and dequantises the output back to the input dtype, all inside one jitted call (transforms timed).

The output is always e4m3: JAX's ``_dot_product_attention_fp8_fwd_abstract`` builds the output
aval from the query's (``_attention_out_aval(query, ...)``) and the FP8 path needs the query in
float8, so cuDNN's bf16-output FP8 mode cannot be asked for through JAX (tests/test_fp8_recipes.py
reads that function; the H200 probe: results/gpu-2026-12-03b-final/fp8_api_probe.txt).

It is a private API: it is guarded by feature checks and raises ``UnsupportedError`` where they fail.
"""
from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp

from ..core import device
from ..core.call import Call
from .cudnn import CudnnBackend
from .fp8_recipe import RECIPES, Fp8Recipe, backend_name, name_of_recipe, quantise, quantised_qk, suffix_of, tensor_scale

FP8_KEYS = ("amax_dQ", "amax_dK", "amax_dV", "amax_dP", "descale_q", "descale_k", "descale_v", "descale_s",
            "scale_s", "scale_o", "descale_o", "descale_dO", "descale_dP", "scale_dQ", "scale_dK", "scale_dV", "scale_dP")
#: The private function whose output aval follows the query's dtype (always e4m3 on the FP8 path).
FP8_ABSTRACT = "_dot_product_attention_fp8_fwd_abstract"


@functools.lru_cache(maxsize=None)
def _private_api():
    """(module, reason): JAX's cuDNN fused-attention module if it has the FP8 entry point."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa  # JAX-private: may move
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


def _cudnn_call(q8, k8, v8, params: dict, scale: float, causal: bool):
    """cuDNN's FP8 forward: e4m3 q (B, T, N, H), k, v (B, S, N, H) and (1, 1, 1, 1) float32 scale
    factors -> e4m3 output (B, T, N, H). Tests replace it with a float32 emulation."""
    fa, _ = _private_api()
    mask_type = fa.MaskType.CAUSAL if causal else fa.MaskType.NO_MASK
    out8, _, _ = fa.dot_product_attention(q8, k8, v8, fp8_params=params, scale=scale, mask_type=mask_type,
                                          qkv_layout="BTNH", use_fp8=True)
    return out8


def fp8_attention(q, k, v, recipe: Fp8Recipe, *, scale: float, causal: bool):
    """Attention of q (B, T, N, H), k, v (B, S, N, H) through e4m3 as ``recipe`` says; out in q's dtype."""
    q8, k8, sq, sk, gain = quantised_qk(recipe, q, k)
    sv = tensor_scale(v, recipe.scales)
    ss = jnp.float32(recipe.softmax_scale)            # softmax probabilities lie in [0, 1]
    so = jnp.float32(1.0) if recipe.scales == "unit" else sv   # |out| <= max |v|: the output shares v's scale
    one = jnp.ones((1, 1, 1, 1), jnp.float32)
    params = {n: one for n in FP8_KEYS}
    params.update(descale_q=one / sq, descale_k=one / sk, descale_v=one / sv, descale_s=one / ss,
                  scale_s=one * ss, scale_o=one * so)
    out8 = _cudnn_call(q8, k8, quantise(v, sv), params, float(scale) / gain, causal)
    return (out8.astype(jnp.float32) / so).astype(q.dtype)


class CudnnFp8Backend(CudnnBackend):
    """``CudnnFp8Backend(suffix)``: the recipe ``fp8_recipe.RECIPES[suffix]``, named ``cudnn-fp8-<suffix>``."""
    forward_only = True
    rel_l2_limit = 0.1
    rel_l2_rule = "float8 e4m3 inside: rel L2 <= 0.1, worst row <= 0.2"
    compute_dtype = "float8_e4m3fn"
    fp8 = True
    residual = False   # the FP8 entry point returns no logsumexp here
    min_compute_capability = (9, 0)
    peer_parts = ("fp8",)
    peer_variants = ("cudnn-fp8-unit",)    # unit scales: what JAX's own tests call the kernel with
    takes_fp8_recipe = True

    def __init__(self, suffix: str = ""):
        self.recipe = RECIPES[suffix]
        self.name = backend_name(suffix)
        self.description = f"cuDNN FP8 (e4m3) flash attention via JAX's private API: {self.recipe.describe()}"

    def recipe_variant(self, recipe: str) -> str:
        return name_of_recipe(recipe)

    def variant_names(self) -> list[str]:
        return [backend_name(s) for s in RECIPES]

    def configured(self, name: str) -> CudnnFp8Backend | None:
        """The recipe variant called ``name`` (``cudnn-fp8-hadamard``), one instance per recipe."""
        suffix = suffix_of(name)
        if suffix is None:
            return None
        return self if suffix == self.recipe_suffix else _variant(suffix)

    @property
    def recipe_suffix(self) -> str:
        return suffix_of(self.name)

    @property
    def unit_scales(self) -> bool:
        return self.recipe.scales == "unit"

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

    def supports(self, spec: Call) -> str | None:
        if spec.dtype not in ("float16", "bfloat16"):
            return f"dtype {spec.dtype} not supported (takes float16/bfloat16, computes in float8_e4m3fn)"
        if spec.head_dim > 256 or spec.head_dim % 16:
            return f"head dim {spec.head_dim} must be <= 256 and a multiple of 16 for FP8"
        if self.recipe.hadamard and spec.head_dim & (spec.head_dim - 1):
            return f"head dim {spec.head_dim} is not a power of two (the Hadamard rotation needs one)"
        if spec.kv_heads != spec.heads:
            return "grouped key/value heads (K != N) are not exercised by JAX's FP8 path"
        if spec.bias_shape or spec.mask_shape or spec.has_q_lengths or spec.has_kv_lengths or spec.window:
            return "FP8 attention takes no bias, mask, sequence lengths or window (causal or none only)"
        return None

    def run(self, p: Call):
        return fp8_attention(p.query, p.key, p.value, self.recipe, scale=float(p.scale), causal=p.is_causal)

    def facts(self, fwd, q, k, v, fwd_as=None) -> dict | None:
        """The recipe this record ran (``fp8_recipe.Fp8Recipe`` as a dict) and that the output was e4m3."""
        return {"fp8_recipe": self.recipe.as_dict(), "fp8_output_dtype": "float8_e4m3fn"}



@functools.lru_cache(maxsize=None)
def _variant(suffix: str) -> CudnnFp8Backend:
    return CudnnFp8Backend(suffix)
