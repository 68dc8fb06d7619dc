"""Attention sinks in attnlab's Pallas kernels (interpret mode on the CPU) against float64: the decode
kernel (the split combine) and the serving kernel (the merge
of stream-K pieces), with GQA, splits, ragged lengths, paged caches, the soft cap, under jit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab import backends
from attnlab.kernels import decode as kd
from attnlab.kernels import serving_plan as sp
from attnlab.kernels.pages import to_pages
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.inputs import random_qkv
from attnlab.reference.serving64 import reference_serving_attention
from attnlab.reference.tolerance import rel_l2, tolerance

#: one per query head (N = 8): large and small against the rows' logits, and -inf (the head without)
SINKS = jnp.array([2.0, -1.0, 0.5, 3.0, -np.inf, 1.0, 0.0, 4.0], jnp.float32)


def test_decode_kernel_sinks_match_float64(monkeypatch):
    """decode_attention on attnlab-decode: a paged cache (the combine, where the sinks go, is the contiguous
    call's), G = 4, T = 3 causal, 3 splits of 16-key blocks, ragged lengths (the short sequence's splits past
    its end see no key), soft cap, traced sinks under jit."""
    B, T, S, N, K, H = 2, 3, 96, 8, 2, 32
    lengths = jnp.array([96, 19], jnp.int32)
    q, k, v = random_qkv(B, T, S, N, K, H, "float32", seed=7)
    monkeypatch.setattr(backends.get("attnlab-decode"), "config", kd.DecodeConfig(block_k=16, num_splits=3))
    kc, vc, table = to_pages(k, v, 16)
    fn = jax.jit(lambda q, k, v, n, t, s: attnlab.decode_attention(
        q, k, v, n, page_table=t, logits_soft_cap=3.0, sinks=s, implementation="attnlab-decode"))
    out = fn(q, kc, vc, lengths, table, SINKS)
    verdict = check_decode_close(out, q, k, v, lengths, logits_soft_cap=3.0, sinks=SINKS)
    assert verdict.ok, verdict
    assert not check_decode_close(out, q, k, v, lengths, logits_soft_cap=3.0).ok, "the sinks change the result"


def test_attention_path_on_the_decode_kernel_takes_sinks():
    """attention(key_value_seq_lengths=...) on attnlab-decode passes its sinks to the kernel. (The Mosaic GPU
    kernel shares the split combine; JAX's GPU interpreter takes ~40 s, so tests/gpu covers it.)"""
    q, k, v = random_qkv(2, 1, 32, 8, 2, 16, "float32", seed=2)
    lengths = jnp.array([32, 20], jnp.int32)
    out = attnlab.attention(q, k, v, key_value_seq_lengths=lengths, sinks=SINKS, implementation="attnlab-decode")
    verdict = check_decode_close(out, q, k, v, lengths, causal=False, sinks=SINKS)
    assert verdict.ok, verdict


def test_serving_kernel_sinks_match_float64():
    """A paged cache (the merge, where the sinks go, is the contiguous call's), a mixed batch (decode and prefill classes), G = 4, a long request split into stream-K pieces that the
    merge combines, G = 7 (a prefill request's row tiles start mid-group), soft cap, a padding token, traced
    lengths and sinks under jit."""
    q_len, kv = np.array([1, 5, 1, 2], np.int32), np.array([48, 30, 5, 40], np.int32)
    starts = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    N, K, H, S = 14, 2, 16, 48
    sinks = jnp.concatenate([SINKS, SINKS[:6] - 0.5])
    rng = np.random.default_rng(1)
    q = rng.standard_normal((int(starts[-1]) + 1, N, H)).astype(np.float32)
    k, v = (rng.standard_normal((len(kv), S, K, H)).astype(np.float32) for _ in range(2))
    ref = reference_serving_attention(q, k, v, starts, kv, logits_soft_cap=2.5, sinks=sinks)
    kc, vc, table = to_pages(k, v, 8)
    cfg = sp.ServingConfig(block_k=16, decode_max_q=4, programs=3, block_r_prefill=16)

    def step(q, k, v, a, b, t, s):
        plan = attnlab.serving_plan(a, b, total_tokens=q.shape[0], kv_len_max=S, heads=N, kv_heads=K,
                                    head_dim=H, dtype="float32", config=cfg)
        return attnlab.serving_attention(q, k, v, a, b, page_table=t, logits_soft_cap=2.5, sinks=s,
                                         implementation="attnlab-decode", plan=plan)

    out = np.asarray(jax.jit(step)(q, kc, vc, jnp.asarray(starts), jnp.asarray(kv), table, sinks), np.float64)
    limit, rule = tolerance(np.float32)
    assert rel_l2(out, ref) <= limit, rule
    assert not np.any(out[-1]), "the padding token gives 0"
    without = reference_serving_attention(q, k, v, starts, kv, logits_soft_cap=2.5)
    assert rel_l2(out, without) > 100 * limit, "the sinks change the result"


def test_serving_merge_with_sinks_lowers_to_triton_for_sm90():
    """No GPU here: the merge kernel's gather of a (N,) sinks row (N = 14, not a power of two) lowers to Triton
    IR for an abstract H200, one load more than the merge without sinks."""
    import contextlib

    import jax._src.pallas.triton.pallas_call_registration as reg

    from attnlab.kernels import serving as ks

    s = jax.ShapeDtypeStruct
    B, S, N, K, H = 4, 256, 14, 2, 64
    args = [s((B, N, H), jnp.bfloat16), s((B, S, K, H), jnp.bfloat16), s((B, S, K, H), jnp.bfloat16),
            s((B + 1,), jnp.int32), s((B,), jnp.int32)]

    def merge_loads(*sinks):
        def f(q, k, v, a, b, *sk):
            plan = sp.make_serving_plan(a, b, total_tokens=B, kv_len_max=S, heads=N, kv_heads=K, head_dim=H, sms=132)
            return ks.serving_attention_pallas(q, k, v, a, b, plan=plan, interpret=False, sinks=sk[0] if sk else None)

        captured, orig = [], reg.lowering.lower_jaxpr_to_triton_module

        def keep(*a, **kw):
            res = orig(*a, **kw)
            captured.append(res.module.operation.get_asm(enable_debug_info=False))
            return res

        with contextlib.ExitStack() as stack:
            stack.callback(setattr, reg.lowering, "lower_jaxpr_to_triton_module", orig)
            reg.lowering.lower_jaxpr_to_triton_module = keep
            with kd.cuda_lowering_context():
                jax.jit(f).trace(*args, *sinks).lower(lowering_platforms=("cuda",))
        return captured[-1].count("tt.load")

    assert merge_loads(s((N,), jnp.float32)) == merge_loads() + 1
