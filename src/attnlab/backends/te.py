"""NVIDIA TransformerEngine-JAX: ``transformer_engine.jax.flax.DotProductAttention``.

TE takes BSHD (= attnlab's BTNH) inputs, names its mask types ('no_mask', 'causal', 'padding',
'padding_causal') and uses the opposite mask polarity to jax.nn (True = masked out). TE falls
back to its unfused JAX attention with only a warning when no fused kernel fits; this backend
asks TE's own availability check first and refuses instead, so 'te' always means fused TE.
``te-fp8`` runs the same module under ``te.autocast`` with a DelayedScaling recipe; on the H200
that leaves DotProductAttention unchanged (no FP8 in the compiled program): ``fp8_engaged`` says so.
"""
from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp

from ..core.call import Call
from . import _optional
from .base import Backend, zero_padded_queries

FUSED_MARKER = "te_fused_attn_forward"


@functools.lru_cache(maxsize=None)
def _module(heads: int, kv_heads: int, head_dim: int, mask_type: str, scale: float):
    """One DotProductAttention per configuration (it has no parameters: apply with {})."""
    from transformer_engine.jax.flax import DotProductAttention  # optional: transformer_engine

    return DotProductAttention(head_dim=head_dim, num_attention_heads=heads, num_gqa_groups=kv_heads,
                               attn_mask_type=mask_type, qkv_layout="bshd_bshd_bshd", scale_factor=scale,
                               transpose_batch_sequence=False, attention_dropout=0.0)


def _mask_type(spec: Call) -> str:
    padding = spec.has_q_lengths or spec.has_kv_lengths
    return {(False, False): "no_mask", (True, False): "causal", (False, True): "padding",
            (True, True): "padding_causal"}[(spec.is_causal, padding)]


def _te_rejection(args) -> str:
    """TE's own diagnostic for a rejected configuration (its get_fused_attn_backend message), if it gives one."""
    try:
        from transformer_engine.jax.cpp_extensions.attention import FusedAttnHelper  # optional: transformer_engine

        names = ("is_training", "batch_size", "q_dtype", "kv_dtype", "qkv_layout", "attn_bias_type", "attn_mask_type",
                 "softmax_type", "dropout_probability", "q_num_heads", "kv_num_heads", "q_max_seqlen", "kv_max_seqlen",
                 "head_dim_qk", "head_dim_v")
        kw = dict(zip(names, args))
        _, message = FusedAttnHelper(**kw, window_size=(-1, -1)).get_fused_attn_backend()
        return message or "no message from TE"
    except Exception as e:  # noqa: BLE001
        return f"TE gave no diagnostic ({type(e).__name__})"


class TeBackend(Backend):
    name = "te"
    peer_parts = ("fwd", "train", "decode", "fp8", "auto")
    description = "TransformerEngine-JAX DotProductAttention (cuDNN fused attention through TE)"
    soft_cap_reason = "logits_soft_cap: TransformerEngine-JAX's DotProductAttention takes no soft cap"

    library = ("transformer_engine", "te")
    library_dists = ("transformer_engine", "transformer-engine", "transformer_engine_jax")
    companion_libraries = {"flax": ("flax",)}   # TE-JAX's DotProductAttention is a flax module
    min_compute_capability = (8, 0)

    def supports(self, spec: Call) -> str | None:
        if spec.dtype not in ("float16", "bfloat16"):
            return f"dtype {spec.dtype} not supported (float16/bfloat16)"
        if spec.bias_shape or spec.mask_shape or spec.window:
            return "attnlab's te backend takes no bias, custom mask or window (no mask, causal, padding)"
        return self._fused_reason(spec)

    def _fused_reason(self, spec: Call) -> str | None:
        _optional.preload_pip_cudnn()
        try:
            from transformer_engine.jax.attention import (AttnBiasType, AttnMaskType, AttnSoftmaxType, QKVLayout,  # optional: transformer_engine
                                                          is_fused_attn_kernel_available)
        except Exception as e:  # noqa: BLE001
            return f"TransformerEngine's attention module cannot be imported ({type(e).__name__}: {e})"
        mask = {"no_mask": AttnMaskType.NO_MASK, "causal": AttnMaskType.CAUSAL_MASK, "padding": AttnMaskType.PADDING_MASK,
                "padding_causal": AttnMaskType.PADDING_CAUSAL_MASK}[_mask_type(spec)]
        dt = jnp.dtype(spec.dtype)
        for training in (False, True):
            args = (training, spec.batch, dt, dt, QKVLayout.BSHD_BSHD_BSHD, AttnBiasType.NO_BIAS, mask,
                    AttnSoftmaxType.VANILLA_SOFTMAX, 0.0, spec.heads, spec.kv_heads, spec.q_len, spec.kv_len,
                    spec.head_dim, spec.head_dim, None)
            try:
                ok = is_fused_attn_kernel_available(*args)
            except Exception as e:  # noqa: BLE001
                return f"TransformerEngine's fused-kernel check failed ({type(e).__name__}: {e})"
            if not ok:
                return ("TransformerEngine selects no fused kernel for this input "
                        f"({'training' if training else 'inference'}: {_te_rejection(args)}); "
                        "it would fall back to unfused attention")
        return None

    def _context(self):
        return contextlib.nullcontext()

    def run(self, p: Call):
        mod = _module(p.heads, p.kv_heads, p.head_dim, _mask_type(p), float(p.scale))
        kwargs = {}
        if p.has_q_lengths or p.has_kv_lengths:
            T, S = p.q_len, p.kv_len
            ql = jnp.full((p.batch,), T, jnp.int32) if p.q_lengths is None else jnp.asarray(p.q_lengths, jnp.int32)
            kl = jnp.full((p.batch,), S, jnp.int32) if p.kv_lengths is None else jnp.asarray(p.kv_lengths, jnp.int32)
            visible = (jnp.arange(T)[None, :, None] < ql[:, None, None]) & (jnp.arange(S)[None, None, :] < kl[:, None, None])
            kwargs["mask"] = ~visible[:, None]            # TE: True = masked out
        with self._context():
            out = mod.apply({}, p.query, p.key, p.value, deterministic=True, **kwargs)
        return zero_padded_queries(out, p)                 # jax.nn semantics: padded query rows are 0

    def fused_in_hlo(self, fn, *args) -> bool:
        return FUSED_MARKER in jax.jit(fn).lower(*args).as_text()

    def facts(self, fwd, q, k, v, fwd_as=None) -> dict:
        return {"te_fused": self.fused_in_hlo(fwd, q, k, v)}


class TeFp8Backend(TeBackend):
    name = "te-fp8"
    peer_parts = ("fp8",)
    fp8 = True
    description = "TransformerEngine DotProductAttention under te.autocast(DelayedScaling): FP8 if TE engages it"

    def _context(self):
        import transformer_engine.jax as te  # optional: transformer_engine
        from transformer_engine.common import recipe  # optional: transformer_engine

        return te.autocast(enabled=True, recipe=recipe.DelayedScaling())

    def fp8_engaged(self, fn, *args) -> bool:
        """True when the compiled program holds FP8 values (e4m3/e5m2)."""
        text = jax.jit(fn).lower(*args).compile().as_text()
        return "f8e4m3" in text.lower() or "f8e5m2" in text.lower()

    def facts(self, fwd, q, k, v, fwd_as=None) -> dict:
        """Whether FP8 engaged, and whether the output is bit-identical to plain 'te' on the same call."""
        facts = {"te_fused": self.fused_in_hlo(fwd, q, k, v), "fp8_in_program": self.fp8_engaged(fwd, q, k, v)}
        if fwd_as is not None:
            facts["bit_identical_to_te"] = bool(jnp.all(jax.jit(fwd)(q, k, v) == jax.jit(fwd_as("te"))(q, k, v)))
        return facts
