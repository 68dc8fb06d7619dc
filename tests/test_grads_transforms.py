"""Gradients against the analytic float64 backward; jit and vmap."""
import jax
import jax.numpy as jnp
import pytest

import attnlab
from attnlab.reference import cases
from attnlab.reference.float64 import reference_attention_grads, rel_l2

GRAD_MODES = ["none", "causal", "padding", "bias+causal", "causal+window", "custom+padding", "window"]


@pytest.mark.parametrize("impl", ["naive", "xla"])
@pytest.mark.parametrize("mode", GRAD_MODES)
@pytest.mark.parametrize("dtype,limit", [("float32", 1e-4), ("bfloat16", 4e-2)])
def test_gradients_match_reference(impl, mode, dtype, limit):
    q, k, v, kw = cases.build(mode, batch=2, q_len=8, kv_len=12, heads=4, kv_heads=2, head_dim=8, dtype=dtype, seed=11)
    ct = jax.random.normal(jax.random.key(7), q.shape, jnp.float32)

    def loss(q, k, v):
        out = attnlab.attention(q, k, v, implementation=impl, **kw)
        return jnp.sum(out.astype(jnp.float32) * ct)

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    refs = reference_attention_grads(q, k, v, ct, **kw)
    for name, g, r in zip("qkv", grads, refs):
        assert g.shape == r.shape and g.dtype == q.dtype
        assert rel_l2(g, r) < limit, (name, rel_l2(g, r))


def test_vmap_over_an_extra_axis():
    q, k, v = attnlab.reference.inputs.random_qkv(3, 8, 8, 2, 1, 8, "float32")
    # vmap over the batch axis with 3-D (T, N, H) inputs inside
    out = jax.vmap(lambda q, k, v: attnlab.attention(q, k, v, is_causal=True, implementation="naive"))(q, k, v)
    ref = attnlab.reference_attention(q, k, v, is_causal=True)
    assert rel_l2(out, ref) < 1e-5
    out2 = jax.vmap(lambda q, k, v: attnlab.attention(q, k, v, is_causal=True))(q[:, None], k[:, None], v[:, None])
    assert rel_l2(out2[:, 0], ref) < 1e-5


def test_jit_with_traced_lengths_and_scale():
    q, k, v, kw = cases.build("padding", dtype="float32", seed=2)
    f = jax.jit(lambda q, k, v, ql, kl, s: attnlab.attention(q, k, v, scale=s, query_seq_lengths=ql, key_value_seq_lengths=kl))
    out = f(q, k, v, kw["query_seq_lengths"], kw["key_value_seq_lengths"], jnp.float32(0.2))
    ref = attnlab.reference_attention(q, k, v, scale=0.2, **kw)
    assert rel_l2(out, ref) < 1e-5
