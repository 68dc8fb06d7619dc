"""A sliding window, attention sinks and a quantized (FP8) KV cache at once, with the soft cap, GQA G = 7, a paged
cache and ragged lengths: attnlab's decode and serving kernels (Pallas interpret mode) against float64 of the
dequantized cache.

The cache is poisoned with NaN before each window (whole blocks of keys, whole pages) before it is quantized
per page, so a load of a block the window excludes would make the output NaN; the float64 reference reads the
clean cache quantized the same way (per-page scales: the pages it shares with the poisoned one are identical).
Each feature is shown live: the float64 without any one of them fails the same check."""
import functools

import jax
import jax.numpy as jnp
import numpy as np

import attnlab
from attnlab import backends
from attnlab.core.kv_quant import dequantize
from attnlab.kernels import decode as kd
from attnlab.kernels import serving_plan as sp
from attnlab.kernels.pages import gather_pages, to_pages
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.inputs import random_qkv
from attnlab.reference.serving64 import reference_serving_attention
from attnlab.reference.tolerance import rel_l2, tolerance

N, K, H, PAGE, BLOCK = 14, 2, 16, 8, 16          # G = 7; pages of 8 tokens, blocks of 16 keys
#: one per query head: large and small against the rows' logits, and -inf (a head without)
SINKS = np.where(np.arange(N) == 4, -np.inf, np.linspace(-1.0, 3.0, N)).astype(np.float32)
CAP = 3.0


def poisoned(x, firsts):
    """``x`` (B, S, K, H) with NaN at the positions before each sequence's ``firsts[b]``."""
    before = (jnp.arange(x.shape[1])[None, :] < jnp.asarray(firsts)[:, None])[:, :, None, None]
    return jnp.where(before, jnp.nan, x)


def fp8_pages(k, v, firsts):
    """(k_pages, k_scale, v_pages, v_scale, table) of the poisoned cache, and the clean cache's float64 twin
    (B, S, K, H) each, quantized per page in float8_e4m3fn."""
    kp, vp, table = to_pages(poisoned(k, firsts), poisoned(v, firsts), PAGE)
    clean_k, clean_v, _ = to_pages(k, v, PAGE)
    timed, twin = [], []
    for pois, clean in ((kp, clean_k), (vp, clean_v)):
        timed += attnlab.quantize_kv_cache(pois, "fp8", "page")
        c, s = attnlab.quantize_kv_cache(clean, "fp8", "page")
        twin.append(gather_pages(dequantize(np.asarray(c), np.asarray(s), "page", "float64"), np.asarray(table)))
    return (*timed, table), twin


def test_decode_kernel_composes_window_sinks_and_fp8_cache(monkeypatch):
    """decode_attention on attnlab-decode under jit: bf16, T = 2, ragged lengths (one shorter than its window,
    one of T keys), 2 splits of the window's blocks, per-page FP8 scales, traced sinks."""
    B, T, S, window = 3, 2, 64, (20, 0)
    lengths = [64, 45, 2]
    q, k, v = random_qkv(B, T, S, N, K, H, "bfloat16", seed=34)
    firsts = [(kd.window_start(n, T, window) // BLOCK) * BLOCK for n in lengths]
    (kc, ks, vc, vs, table), (k64, v64) = fp8_pages(k, v, firsts)
    monkeypatch.setattr(backends.get("attnlab-decode"), "config", kd.DecodeConfig(block_k=BLOCK, num_splits=2))
    run = jax.jit(functools.partial(attnlab.decode_attention, implementation="attnlab-decode", logits_soft_cap=CAP,
                                    local_window_size=window))
    out = run(q, kc, vc, jnp.array(lengths), page_table=table, sinks=jnp.asarray(SINKS), k_scale=ks, v_scale=vs)
    assert np.all(np.isfinite(np.asarray(out, np.float32))), "a block before the window was read"
    every = dict(logits_soft_cap=CAP, sinks=SINKS, local_window_size=window)
    verdict = check_decode_close(out, q, k64, v64, lengths, **every)
    assert verdict.ok, verdict
    kclean, vclean = (np.asarray(x, np.float64) for x in (k, v))
    for without in ("sinks", "local_window_size", "logits_soft_cap", "quantization"):
        kw = {**every, **({} if without == "quantization" else {without: None})}
        kk, vv = (kclean, vclean) if without == "quantization" else (k64, v64)
        assert not check_decode_close(out, q, kk, vv, lengths, **kw).ok, f"{without} changes nothing"


def test_serving_kernel_composes_window_sinks_and_fp8_cache():
    """serving_attention on attnlab-decode under jit, lengths and sinks traced, the plan made inside from them for
    the window: a mixed batch (a 6-token prefill tile whose G = 7 rows start mid-group, decodes, a request of 2
    keys) in float32, a long request split into stream-K pieces the merge combines with the sinks, a padding token."""
    q_len, kv = np.array([1, 6, 2, 1], np.int32), np.array([48, 30, 9, 2], np.int32)
    S, left, dtype = 48, 10, "float32"
    starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    rng = np.random.default_rng(34)
    q = rng.standard_normal((int(starts[-1]) + 1, N, H)).astype(dtype)
    k, v = (jnp.asarray(rng.standard_normal((len(kv), S, K, H)).astype(dtype)) for _ in range(2))
    firsts = [(max(0, n - t - left) // BLOCK) * BLOCK for n, t in zip(kv, q_len)]
    (kc, ks, vc, vs, table), (k64, v64) = fp8_pages(k, v, firsts)
    cfg = sp.ServingConfig(block_k=BLOCK, decode_max_q=4, programs=3, block_r_prefill=16)
    every = dict(logits_soft_cap=CAP, sinks=SINKS, local_window_size=left)

    def step(q, kc, ks, vc, vs, table, a, b, sinks):
        plan = attnlab.serving_plan(a, b, total_tokens=q.shape[0], kv_len_max=S, heads=N, kv_heads=K, head_dim=H,
                                    dtype=dtype, config=cfg, local_window_size=left)
        return attnlab.serving_attention(q, kc, vc, a, b, page_table=table, k_scale=ks, v_scale=vs, plan=plan,
                                         implementation="attnlab-decode", **{**every, "sinks": sinks})

    out = jax.jit(step)(q, kc, ks, vc, vs, table, jnp.asarray(starts), jnp.asarray(kv), jnp.asarray(SINKS))
    out = np.asarray(out, np.float64)
    limit, rule = tolerance(np.dtype(dtype))
    ref = reference_serving_attention(q, k64, v64, starts, kv, **every)
    assert np.all(np.isfinite(out)) and rel_l2(out, ref) <= limit, (rel_l2(out, ref), rule)
    assert not np.any(out[-1]), "the padding token gives 0"
    kclean, vclean = (np.asarray(x, np.float64) for x in (k, v))
    for without in ("sinks", "local_window_size", "logits_soft_cap", "quantization"):
        kw = {**every, **({} if without == "quantization" else {without: None})}
        kk, vv = (kclean, vclean) if without == "quantization" else (k64, v64)
        assert rel_l2(out, reference_serving_attention(q, kk, vv, starts, kv, **kw)) > 100 * limit, without
