"""attnlab.attention as a drop-in for the installed jax.nn.dot_product_attention, and the top-level API."""
import inspect
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from _dtypes import dtype_context, skip_xla_float64
import attnlab.reference.inputs
from attnlab.reference import cases


def test_sharded_attention_is_top_level_and_lazy():
    from attnlab.api import sharded

    assert attnlab.sharded_attention is sharded.sharded_attention
    assert attnlab.make_mesh is sharded.make_mesh
    assert "sharded_attention" in attnlab.__all__ and "sharded_attention" in dir(attnlab)
    # import attnlab stays cheap: the sharded module loads on first use only
    code = "import sys, attnlab; assert 'attnlab.api.sharded' not in sys.modules; attnlab.sharded_attention; " \
           "assert 'attnlab.api.sharded' in sys.modules"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    try:
        attnlab.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("attnlab.no_such_name should raise AttributeError")


# --- signature parity with the installed jax.nn.dot_product_attention ---------------------------

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def test_signature_matches_installed_jax():
    """Every parameter of the installed JAX's function, same kind and default; extras keyword-only."""
    theirs = inspect.signature(jax.nn.dot_product_attention).parameters
    ours = inspect.signature(attnlab.attention).parameters
    missing = [n for n in theirs if n not in ours]
    assert not missing, f"attnlab.attention lacks jax.nn.dot_product_attention's {missing} (jax {jax.__version__})"
    for name, p in theirs.items():
        assert ours[name].kind == p.kind, (name, ours[name].kind, p.kind)
        assert ours[name].default == p.default, (name, ours[name].default, p.default)
    assert [n for n, p in ours.items() if p.kind in POSITIONAL] == [n for n, p in theirs.items() if p.kind in POSITIONAL]
    for name in set(ours) - set(theirs):
        assert ours[name].kind == inspect.Parameter.KEYWORD_ONLY and ours[name].default is not inspect.Parameter.empty


# --- return_residual ----------------------------------------------------------------------------



RES_MODES = ("none", "causal+padding", "custom+padding", "bias+window+padding")
TOL = {"float32": 1e-5, "float64": 1e-5, "bfloat16": 2e-2}




@pytest.mark.parametrize("impl", ["naive", "xla", None])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("mode", RES_MODES)
def test_return_residual_matches_jax(impl, dtype, mode):
    skip_xla_float64(impl, dtype)
    with dtype_context(dtype):
        q, k, v, kw = cases.build(mode, batch=2, q_len=8, kv_len=12, heads=4, kv_heads=2, head_dim=8, dtype=dtype, seed=2)
        want_out, want_lse = jax.nn.dot_product_attention(q, k, v, return_residual=True, **kw)
        out, lse = attnlab.attention(q, k, v, implementation=impl, return_residual=True, **kw)
        assert (out.shape, out.dtype) == (want_out.shape, want_out.dtype)
        assert (lse.shape, lse.dtype) == (want_lse.shape, want_lse.dtype) == (q.shape[:-1], q.dtype)
        tol = TOL[dtype]
        np.testing.assert_allclose(np.asarray(lse, np.float64), np.asarray(want_lse, np.float64), rtol=tol, atol=tol)
        np.testing.assert_allclose(np.asarray(out, np.float64), np.asarray(want_out, np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("impl", ["naive", "xla"])
def test_return_residual_three_dim_and_jit(impl):
    q, k, v = attnlab.reference.inputs.random_qkv(1, 6, 10, 4, 1, 8, "float32", seed=3)
    q, k, v = q[0], k[0], v[0]
    fn = jax.jit(lambda q, k, v: attnlab.attention(q, k, v, is_causal=True, implementation=impl, return_residual=True))
    out, lse = fn(q, k, v)
    want_out, want_lse = jax.nn.dot_product_attention(q, k, v, is_causal=True, return_residual=True)
    assert out.shape == (6, 4, 8) and lse.shape == want_lse.shape == (6, 4)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    # no residual asked: a plain array, as before
    assert isinstance(attnlab.attention(q, k, v, implementation=impl), jax.Array)


@pytest.mark.parametrize("impl", ["naive", "xla", None])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", ["causal+padding", "bias+window+padding"])
def test_return_residual_gradients_match_jax(impl, dtype, mode):
    """Gradients of a loss through both outputs equal jax.nn's (whose residual carries no gradient)."""
    skip_xla_float64(impl, dtype)
    with dtype_context(dtype):
        q, k, v, kw = cases.build(mode, batch=2, q_len=8, kv_len=12, heads=4, kv_heads=2, head_dim=8, dtype=dtype, seed=4)
        rng = np.random.default_rng(0)
        ct_out = jnp.asarray(rng.standard_normal(q.shape), dtype)
        ct_lse = jnp.asarray(rng.standard_normal(q.shape[:-1]), dtype)

        def loss(fn):
            def f(q, k, v):
                out, lse = fn(q, k, v)
                keep = lse > -1e30                      # rows that see keys (others are large negative)
                return jnp.sum(out * ct_out) + jnp.sum(jnp.where(keep, lse, 0) * ct_lse)
            return jax.jit(jax.grad(f, argnums=(0, 1, 2)))

        ours = loss(lambda q, k, v: attnlab.attention(q, k, v, implementation=impl, return_residual=True, **kw))(q, k, v)
        theirs = loss(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, return_residual=True, **kw))(q, k, v)
        for a, b, name in zip(ours, theirs, "qkv"):
            assert a.dtype == b.dtype == q.dtype
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5, err_msg=f"d{name}")
        # the residual alone has no gradient, as in jax.nn
        g_lse = jax.grad(lambda q: jnp.sum(attnlab.attention(q, k, v, implementation=impl, return_residual=True, **kw)[1]))(q)
        assert not np.any(np.asarray(g_lse))


def test_return_residual_refused_with_reason_where_not_supported():
    q, k, v = attnlab.reference.inputs.random_qkv(2, 1, 32, 4, 2, 16, "float32", seed=5)
    lens = jnp.asarray([10, 32], jnp.int32)
    e = attnlab.explain(q, k, v, key_value_seq_lengths=lens, return_residual=True)
    assert e.reasons["naive"] is None and e.reasons["xla"] is None
    assert "return_residual" in e.reasons["attnlab-decode"]
    with pytest.raises(attnlab.UnsupportedError, match="attnlab-decode: return_residual"):
        attnlab.attention(q, k, v, key_value_seq_lengths=lens, implementation="attnlab-decode", return_residual=True)
    with pytest.raises(TypeError, match="return_residual must be a bool"):
        attnlab.attention(q, k, v, return_residual="yes")
