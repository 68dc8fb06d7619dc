"""``attnlab-decode``: attnlab's own Pallas decode kernel (``attnlab.kernels.decode``) as a backend.

Two ways in:
  * ``attention(q, k, v, key_value_seq_lengths=L, implementation="attnlab-decode")`` with a small
    T (T*G <= 512) and no other mask: jax.nn's rule, every valid key ``s < L[b]`` (no lengths:
    all S keys). ``is_causal`` is refused here: jax.nn's causal rule is top-left aligned
    (query t sees s <= t), which is not decode's; use ``attnlab.decode_attention(causal=True)``.
  * ``attnlab.decode_attention(..., implementation="attnlab-decode")``: also the causal tail rule
    (query t at position L[b] - T + t), which the kernel applies natively (``run_decode``).

Runs on NVIDIA GPUs (compute capability >= 8.0) compiled by Triton, and on the CPU in Pallas
interpret mode (correct but slow: for tests). Forward only. ``sinks`` (gpt-oss's attention sinks) are
added to each row's denominator once: in the split combine (in the kernel itself at one split) and in the
serving merge.

Auto: not in ``AUTO_ORDER``; two hooks claim calls for it: ``auto_reason(decode spec)`` for
``decode_attention`` and ``auto_claim(attention spec)`` for ``attention`` (None = auto runs this
kernel). On the H200 (``results/gpu-2026-12-03-validate``: B=8, S=32768, GQA 32/8, H=128, bf16) it
reads the cache at 4.25-4.31 TB/s for T = 2-16, 3.9x cuDNN, and is faster than cuDNN up to T = 64;
at T = 1 cuDNN is 1.4% faster (0.2452 vs 0.2487 ms), so ``decode_attention``'s auto takes it from
``AUTO_MIN_T = 2`` on an NVIDIA GPU. ``attention()``'s auto claims it only with
``AUTO_CLAIMS_ATTENTION = True`` (off by default): the kernel is forward only, and ``attention()``
may be differentiated, where auto must not pick a path that then fails; name it with
``implementation="attnlab-decode"`` (``explain`` lists it) for inference.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..core import device
from ..core.call import Call
from ..core.checks import _is_tracer
from ..core.errors import UnsupportedError
from ..core.problem import Problem
from ..core.serving_cost import H200_BANDWIDTH, H200_PEAK_FLOPS, causal_pairs, keys_read
from ..kernels import decode_plan as kd
from ..kernels.serving_plan import make_serving_plan
from .base import Backend

#: Auto picks the kernel only when this is True (set from the benchmark), on an NVIDIA GPU,
#: for T >= AUTO_MIN_T, where it supports the call.
AUTO_ENABLED = True
AUTO_MIN_T = 2
AUTO_MAX_T = 64
AUTO_CLAIMS_ATTENTION = False
AUTO_MIN_S = 1024


def _common(p: Problem) -> str | None:
    """The kernel's shape and dtype limits for a problem (an attention call's, or a decode call's with
    kv_len = S_max)."""
    return kd.unsupported(p.q_len, p.kv_len, p.heads, p.kv_heads, p.head_dim, p.dtype)


def _static_scale_and_pages(spec) -> str | None:
    """What a call's kernel compiles in: a Python float scale and a power-of-two page size; and int32 indices, which
    JAX's x64 mode would make int64 (the kernels' index arithmetic mixes the two)."""
    if jax.config.jax_enable_x64:
        return "JAX's x64 mode is on (jax_enable_x64): the kernels index in int32"
    if not spec.scale_is_static:
        return "scale is traced: the kernel compiles the scale in (pass a Python float)"
    ps = spec.page_size
    if ps is not None and ps & (ps - 1):
        return f"page size {ps} is not a power of two (the kernel loads whole pages or power-of-two parts)"
    return None


class AttnlabDecodeBackend(Backend):
    name = "attnlab-decode"
    description = ("attnlab's Pallas flash-decoding kernel (Triton; Mosaic GPU wgmma above 64 rows on Hopper): "
                   "GQA-packed rows, split KV, valid lengths only")
    forward_only = True
    takes_soft_cap = True   # one tanh on the kernel's scores
    takes_any_scale = True
    paged = True            # run_decode reads the pages through the table
    takes_decode_window = True   # the kernels load only the window's KV blocks
    takes_kv_scales = True  # a quantized cache (FP8/int8 + scales) dequantized in registers, decode and serving
    peer_parts = ("decode",)
    takes_sinks = True      # to each row's denominator: split combine (one split: the kernel), serving merge
    #: Tuning parameters used by run/run_decode (None: the defaults of attnlab.kernels.decode).
    config: kd.DecodeConfig | None = None

    def available(self) -> str | None:
        info = device.current()
        if info.platform == "cpu":
            return None   # Pallas interpret mode
        if info.platform != "gpu" or info.compute_capability is None:
            return f"needs an NVIDIA GPU (or the CPU, in interpret mode); JAX's default device is {info.platform} ({info.kind})"
        if info.compute_capability < (8, 0):
            cc = ".".join(map(str, info.compute_capability))
            return f"needs compute capability >= 8.0, device has {cc}"
        return None

    @property
    def interpret(self) -> bool:
        return device.current().platform != "gpu"

    def supports(self, spec: Call) -> str | None:
        why = _common(spec.problem)
        if why:
            return why
        if spec.is_causal:
            return ("is_causal is jax.nn's top-left rule (query t sees s <= t), not decode's; "
                    "use attnlab.decode_attention(causal=True) for the causal tail")
        used = [n for n, on in (("bias", spec.bias_shape), ("mask", spec.mask_shape),
                                ("query_seq_lengths", spec.has_q_lengths), ("local_window_size", spec.window)) if on]
        if used:
            return f"takes no {', '.join(used)} (key_value_seq_lengths only)"
        return _static_scale_and_pages(spec)

    def supports_decode(self, spec) -> str | None:
        """Why ``decode_attention`` cannot run ``spec`` (an decode ``Call``) here, or None."""
        return _common(spec.problem) or _static_scale_and_pages(spec)

    def auto_reason(self, spec) -> str | None:
        """The auto hook: None when ``decode_attention(implementation=None)`` should run this kernel."""
        if not AUTO_ENABLED:
            return "auto off until the H200 benchmark decides (attnlab.backends.attnlab_decode.AUTO_ENABLED)"
        if self.interpret:
            return "interpret mode (no GPU): correct but slow"
        # cuDNN takes no decode window and no quantized cache
        if spec.q_len < AUTO_MIN_T and spec.window is None and spec.kv_scale is None:
            return f"T={spec.q_len} < {AUTO_MIN_T}: cuDNN is as fast at T=1"
        return self.available() or self.supports_decode(spec)

    def auto_claim(self, spec: Call) -> str | None:
        """The ``attention()`` auto hook: None when auto should run this kernel for ``spec``."""
        if not AUTO_ENABLED:
            return "auto off (attnlab.backends.attnlab_decode.AUTO_ENABLED)"
        if not AUTO_CLAIMS_ATTENTION:
            return ("forward only: attention()'s auto does not take it (it may be differentiated); "
                    "decode_attention's auto does, or name it")
        if self.interpret:
            return "interpret mode (no GPU): correct but slow"
        if not AUTO_MIN_T <= spec.q_len <= AUTO_MAX_T or spec.kv_len < AUTO_MIN_S:
            return (f"auto takes it for decode shapes only: {AUTO_MIN_T} <= T <= {AUTO_MAX_T} and S >= {AUTO_MIN_S} "
                    f"(T={spec.q_len}, S={spec.kv_len})")
        return self.why_not(spec)

    def supports_serving(self, spec) -> str | None:
        """Why ``serving_attention`` cannot run ``spec`` (an serving ``Call``) on the
        serving kernel (``kernels.serving``), or None."""
        p = spec.problem
        if p.dtype not in kd.DTYPES:
            return f"dtype {p.dtype} not supported (float16, bfloat16 or float32)"
        if p.head_dim not in kd.HEAD_DIMS:
            return f"head dim {p.head_dim} not supported (one of {', '.join(map(str, kd.HEAD_DIMS))})"
        return _static_scale_and_pages(spec)

    def auto_serving_reason(self, spec) -> str | None:
        """None when ``serving_attention(implementation=None)`` should run the serving kernel."""
        if self.interpret:
            return "interpret mode (no GPU): correct but slow"
        return self.available() or self.supports_serving(spec)

    def run_serving(self, call):
        """Run a serving ``Call`` on the serving kernel (its plan, or one made here)."""
        why = self.supports_serving(call)
        if why:
            raise UnsupportedError(self.name, why)
        from ..kernels.serving import serving_attention_pallas  # heavy: Pallas, not at CLI start

        p = call.problem
        plan = call.plan or make_serving_plan(call.q_starts, call.kv_lengths, total_tokens=p.q_len,
                                              kv_len_max=p.kv_len, heads=p.heads, kv_heads=p.kv_heads,
                                              head_dim=p.head_dim, dtype=p.dtype,
                                              window_left=None if p.window is None else p.window[0],
                                              page_size=call.page_size)
        return serving_attention_pallas(call.q, call.k_cache, call.v_cache, call.q_starts, call.kv_lengths,
                                        plan=plan, scale=float(call.scale), page_table=call.page_table,
                                        soft_cap=call.soft_cap, interpret=self.interpret, sinks=call.sinks,
                                        k_scale=call.k_scale, v_scale=call.v_scale, kv_scale=call.kv_scale)

    def version(self) -> str | None:
        return f"jax {jax.__version__}"

    def _call(self, q, k, v, lengths, causal, scale, page_table=None, soft_cap=None, window=None, sinks=None,
              scales=(None, None, None)):
        if _is_tracer(scale):
            raise UnsupportedError(self.name, "scale is traced: the kernel compiles the scale in (pass a Python float)")
        from ..kernels.decode import decode_attention_pallas  # heavy: Pallas, not at CLI start

        k_scale, v_scale, layout = scales
        return decode_attention_pallas(q, k, v, lengths, causal=causal, scale=float(scale), config=self.config,
                                       interpret=self.interpret, page_table=page_table, soft_cap=soft_cap,
                                       window=window, sinks=sinks, k_scale=k_scale, v_scale=v_scale, kv_scale=layout)

    def run(self, p: Call):
        B, S = p.batch, p.kv_len
        lengths = jnp.full((B,), S, jnp.int32) if p.kv_lengths is None else p.kv_lengths
        return self._call(p.query, p.key, p.value, lengths, False, p.scale, soft_cap=p.soft_cap, sinks=p.sinks)

    def run_decode(self, d):
        """Run a decode ``Call`` with its causal rule."""
        return self._call(d.query, d.k_cache, d.v_cache, d.kv_lengths, d.causal, d.scale, d.page_table,
                          d.soft_cap, d.window, d.sinks, (d.k_scale, d.v_scale, d.kv_scale))


def kv_bytes(lengths, kv_heads: int, head_dim: int, itemsize: int, *, q_len: int = 1, window=None) -> int:
    """Bytes of K and V a decode call of T = ``q_len`` tokens per sequence must read: the valid keys only (a
    window's keys only: ``serving_cost.keys_read``)."""
    starts = np.arange(len(lengths) + 1) * q_len
    keys = keys_read(starts, lengths, None if window is None else window[0])
    return int(2 * int(keys.sum()) * kv_heads * head_dim * itemsize)


def roofline_ms(lengths, q_len: int, heads: int, kv_heads: int, head_dim: int, itemsize: int, *,
                hbm_tbs: float = H200_BANDWIDTH / 1e12, peak_tflops: float = H200_PEAK_FLOPS / 1e12,
                window=None) -> float:
    """max(bytes / HBM bandwidth, FLOPs / peak) in ms (H200 defaults): the K/V bytes read (``kv_bytes``) and the
    FLOPs of the causal (query, key) pairs computed, a window's only (``serving_cost.causal_pairs``)."""
    nbytes = kv_bytes(lengths, kv_heads, head_dim, itemsize, q_len=q_len, window=window)
    starts = np.arange(len(lengths) + 1) * q_len
    flops = 4.0 * heads * head_dim * causal_pairs(starts, lengths, None if window is None else window[0])
    return max(nbytes / (hbm_tbs * 1e12), flops / (peak_tflops * 1e12)) * 1e3


__all__ = ["AttnlabDecodeBackend", "AUTO_ENABLED", "AUTO_MIN_T", "AUTO_MAX_T", "AUTO_MIN_S", "AUTO_CLAIMS_ATTENTION",
           "kv_bytes", "roofline_ms"]
