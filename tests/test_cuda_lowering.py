"""attnlab-decode's kernels lower for CUDA on the CPU in every configuration the GPU tests run.

``attnlab.serving_attention`` and ``attnlab.decode_attention`` (``implementation="attnlab-decode"``) inside a
jitted step, lengths traced, with attnlab and JAX told they have an H200: Pallas lowers the serving pieces and
merges and the Triton decode kernel to Triton IR, the prefill slots and the Mosaic decode kernel to Mosaic GPU.
What the GPU then compiles (ptxas, shared memory) and computes is tests/gpu's; this catches a lowering error
on the CPU, before a GPU session is spent on it.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab import backends
from attnlab.core import device
from attnlab.core.kv_quant import quantize_kv_cache
from attnlab.kernels import decode as kd
from attnlab.kernels.decode_plan import DecodeConfig
from attnlab.kernels.serving_plan import ServingConfig

S, H = 4096, 128
CASES = {   # (q_len per request, kv_len per request): tests/gpu/test_serving_gpu.py's
    "ragged-decode": ([1] * 6, [4096, 1, 77, 2049, 1000, 4095]),
    "speculative": ([4] * 5, [4, 4096, 129, 3000, 64]),
    "mixed": ([1, 300, 1, 64, 1, 5], [4096, 300, 17, 2000, 1, 4000]),
    "idle-slots": ([1, 0, 200, 0, 4], [4096, 0, 300, 77, 4000]),
}
H200 = device.DeviceInfo(platform="gpu", kind="NVIDIA H200", count=1, compute_capability=(9, 0),
                         cudnn_version=91900)


def lowered_text(case, heads, page, config=(), sinks=False, soft_cap=None, window=None, quantized=None):
    """The CUDA lowering's text of one jitted serving step (5 padding tokens, lengths traced)."""
    N, K = heads
    q_len, kv = (np.array(x, np.int32) for x in CASES[case])
    B, T = len(kv), int(q_len.sum()) + 5
    cfg = ServingConfig(max_q_len=int(q_len.max()), **dict(config))
    s = jax.ShapeDtypeStruct
    cache = s((B, S, K, H), jnp.bfloat16) if page is None else s((B * S // page, page, K, H), jnp.bfloat16)
    table = None if page is None else s((B, S // page), jnp.int32)

    def step(q, k, v, starts, lengths, t):
        kw = dict(logits_soft_cap=soft_cap, local_window_size=window,
                  sinks=jnp.linspace(-2.0, 3.0, N, dtype=jnp.float32) if sinks else None)
        if quantized:
            (k, kw["k_scale"]), (v, kw["v_scale"]) = (quantize_kv_cache(x, *quantized) for x in (k, v))
        plan = attnlab.serving_plan(starts, lengths, total_tokens=T, kv_len_max=S, heads=N, kv_heads=K, head_dim=H,
                                    config=cfg, local_window_size=window, page_size=page)
        return attnlab.serving_attention(q, k, v, starts, lengths, page_table=t, implementation="attnlab-decode",
                                         plan=plan, **kw)

    args = (s((T, N, H), jnp.bfloat16), cache, cache, s((B + 1,), jnp.int32), s((B,), jnp.int32), table)
    with kd.cuda_lowering_context():
        return jax.jit(step).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.fixture
def h200(monkeypatch):
    """attnlab and JAX's default backend see an H200, so the backend runs its kernels, not interpret mode."""
    monkeypatch.setattr(device, "current", lambda: H200)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")


G4, G7, G1 = (32, 8), (56, 8), (8, 8)
MERGES = [dict(merge=m, whole_blocks=w) for m in ("fused", "kernel") for w in (False, True)]


@pytest.mark.parametrize("case,heads,page,options", [
    *[(c, G4, p, {}) for c in CASES for p in (None, 16, 64)],
    *[(c, G7, 16, {"soft_cap": 30.0}) for c in CASES],
    ("idle-slots", G1, None, {}),
    *[(c, G4, 16, {"config": m, "sinks": True, "soft_cap": 30.0}) for c in ("mixed", "idle-slots") for m in MERGES],
    *[("mixed", G7, None, {"config": m, "window": 700}) for m in MERGES],
    *[(c, G4, p, {"quantized": q, "config": {"kv_pairs": pairs}}) for c in ("speculative", "idle-slots")
      for q, p in ((("fp8", "token"), None), (("int8", "head"), 16), (("fp8", "tensor"), 16), (("int8", "page"), 16))
      for pairs in (True, False)],
])
def test_serving_kernel_lowers_to_triton(h200, case, heads, page, options):
    text = lowered_text(case, heads, page, **options)
    assert text.count("__gpu$xla.gpu.triton") + text.count("triton_kernel_call") >= 1
    assert "mosaic_gpu" not in text


@pytest.mark.parametrize("case,page,window,sinks,stream", [
    ("mixed", None, None, False, 0), ("mixed", 16, None, True, 0), ("mixed", 64, 100, False, 0),
    ("idle-slots", 16, None, True, 1)])
def test_prefill_slots_lower_to_mosaic_gpu(h200, case, page, window, sinks, stream):
    chunk = 320 if case == "mixed" else 256
    text = lowered_text(case, G4, page, config=dict(prefill_slots=1, prefill_chunk=chunk, prefill_stream=stream),
                        window=window, sinks=sinks)
    assert "mosaic_gpu" in text and "__gpu$xla.gpu.triton" in text
    assert ('_xla_stream_annotation = "1"' in text) == bool(stream)


@pytest.mark.parametrize("T,heads,page,config,options", [
    *[(T, heads, page, {"kernel": kernel}, {}) for T in (1, 4) for heads in (G4, G7) for page in (None, 16)
      for kernel in ("triton", "mosaic")],
    *[(4, G4, 16, {"kernel": kernel, "direct_output": direct, "whole_blocks": kernel == "triton"},
       {"sinks": True, "local_window_size": 700}) for kernel in ("triton", "mosaic") for direct in (True, False)],
    (1, G1, None, {"whole_blocks": True}, {"logits_soft_cap": 30.0}),
    *[(T, G4, page, {"kernel": kernel, "kv_pairs": pairs}, {"quantized": q}) for T in (1, 4)
      for q, page in ((("fp8", "token"), None), (("int8", "page"), 16)) for kernel in ("triton", None)
      for pairs in (True, False)],
])
def test_decode_kernels_lower(h200, monkeypatch, T, heads, page, config, options):
    text = decode_lowered_text(monkeypatch, T, heads, page, config, options)
    assert ("mosaic_gpu" in text) == (config.get("kernel") == "mosaic")
    assert ("__gpu$xla.gpu.triton" in text or "triton_kernel_call" in text) == (config.get("kernel") != "mosaic")


def test_mosaic_decode_asked_for_a_quantized_cache_says_why_not(h200, monkeypatch):
    with pytest.raises(ValueError, match="a quantized cache runs on the Triton kernel"):
        decode_lowered_text(monkeypatch, 4, G4, None, {"kernel": "mosaic"}, {"quantized": ("fp8", "token")})


def decode_lowered_text(monkeypatch, T, heads, page, config, options):
    """The CUDA lowering's text of a jitted ``decode_attention`` on attnlab-decode configured by ``config``
    (B=8, lengths traced)."""
    N, K = heads
    B = 8
    monkeypatch.setattr(backends.get("attnlab-decode"), "config", DecodeConfig(**config))
    s = jax.ShapeDtypeStruct
    cache = s((B, S, K, H), jnp.bfloat16) if page is None else s((B * S // page, page, K, H), jnp.bfloat16)
    table = None if page is None else s((B, S // page), jnp.int32)

    def step(q, k, v, lengths, t):
        kw = dict(options)
        if kw.pop("sinks", False):
            kw["sinks"] = jnp.linspace(-2.0, 3.0, N, dtype=jnp.float32)
        if quantized := kw.pop("quantized", None):
            (k, kw["k_scale"]), (v, kw["v_scale"]) = (quantize_kv_cache(x, *quantized) for x in (k, v))
        return attnlab.decode_attention(q, k, v, lengths, page_table=t, implementation="attnlab-decode", **kw)

    with kd.cuda_lowering_context():
        return jax.jit(step).trace(s((B, T, N, H), jnp.bfloat16), cache, cache, s((B,), jnp.int32),
                                   table).lower(lowering_platforms=("cuda",)).as_text()
