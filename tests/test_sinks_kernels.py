"""Attention sinks in attnlab's Pallas kernels (interpret mode on the CPU): the attention path on the decode
kernel, and the serving merge's lowering. The decode kernel (the split combine) and the serving kernel (the
merge of stream-K pieces) with sinks, GQA, splits, ragged lengths, paged caches and the soft cap, under jit,
against float64, are tests/test_features_compose.py's (with a window and an FP8 cache at once)."""
import jax
import jax.numpy as jnp
import numpy as np

import attnlab
from attnlab.kernels import decode as kd
from attnlab.kernels import serving_plan as sp
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.inputs import random_qkv

#: one per query head (N = 8): large and small against the rows' logits, and -inf (the head without)
SINKS = jnp.array([2.0, -1.0, 0.5, 3.0, -np.inf, 1.0, 0.0, 4.0], jnp.float32)


def test_attention_path_on_the_decode_kernel_takes_sinks():
    """attention(key_value_seq_lengths=...) on attnlab-decode passes its sinks to the kernel. (The Mosaic GPU
    kernel shares the split combine; JAX's GPU interpreter takes ~40 s, so tests/gpu covers it.)"""
    q, k, v = random_qkv(2, 1, 32, 8, 2, 16, "float32", seed=2)
    lengths = jnp.array([32, 20], jnp.int32)
    out = attnlab.attention(q, k, v, key_value_seq_lengths=lengths, sinks=SINKS, implementation="attnlab-decode")
    verdict = check_decode_close(out, q, k, v, lengths, causal=False, sinks=SINKS)
    assert verdict.ok, verdict


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
            plan = sp.make_serving_plan(a, b, total_tokens=B, kv_len_max=S, heads=N, kv_heads=K, head_dim=H, sms=132,
                                        config=sp.ServingConfig(merge="kernel"))
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
