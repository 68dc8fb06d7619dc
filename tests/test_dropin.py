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
from attnlab.reference.decode64 import reference_decode_attention


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


# --- empty calls and Python-list lengths: what jax.nn runs, attnlab runs --------------------------

def _empty_case(B, T, S, N, extra):
    """q (B, T, N, 8), k/v (B, S, 2, 8) float32 and the call's keywords (``extra`` names them)."""
    rng = np.random.default_rng(7)
    q = jnp.asarray(rng.standard_normal((B, T, N, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((B, S, 2, 8)), jnp.float32) for _ in range(2))
    kw = {"causal+lengths": dict(is_causal=True, query_seq_lengths=[min(T, 1)] * B, key_value_seq_lengths=[S] * B),
          "bias+mask": dict(bias=jnp.ones((1, N, T, S), jnp.float32), mask=jnp.ones((B, 1, 1, S), bool)),
          "window": dict(local_window_size=(1, 0)), "none": {}}[extra]
    return q, k, v, kw


def _outputs_and_grads(f, **kw):
    """jit: (out, lse, dq, dk, dv) of ``f(q, k, v, return_residual=True, **kw)``, cotangents (out + 1, lse)."""
    def run(q, k, v):
        (o, lse), vjp = jax.vjp(lambda q, k, v: f(q, k, v, return_residual=True, **kw), q, k, v)
        return (o, lse, *vjp((o + 1, lse)))
    return jax.jit(run)


@pytest.mark.parametrize("B,T,S,N,extra", [
    (0, 4, 6, 4, "causal+lengths"), (2, 0, 6, 4, "bias+mask"), (2, 4, 0, 4, "causal+lengths"),
    (2, 4, 0, 4, "window"), (2, 4, 6, 0, "none"),
])
def test_empty_calls_match_jax_nn(B, T, S, N, extra):
    """B, T, S or N = 0: jax.nn's output, lse (-inf where S = 0) and gradients, eager and under jit;
    the float64 reference and check_close agree."""
    q, k, v, kw = _empty_case(B, T, S, N, extra)
    theirs_kw = {n: jnp.asarray(x, jnp.int32) if isinstance(x, list) else x for n, x in kw.items()}
    ours = _outputs_and_grads(attnlab.attention, **kw)(q, k, v)
    theirs = _outputs_and_grads(jax.nn.dot_product_attention, **theirs_kw)(q, k, v)
    eager = attnlab.attention(q, k, v, return_residual=True, **kw)
    for a, b in zip((*eager, *ours), (*theirs[:2], *theirs)):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert attnlab.explain(q, k, v, **kw).chosen == "none"
    assert attnlab.check_close(eager[0], q, k, v, **kw).ok
    assert not np.any(attnlab.reference_attention(q, k, v, **kw))


def test_empty_calls_still_check_the_other_rules():
    q, k, v, _ = _empty_case(2, 4, 0, 4, "none")
    with pytest.raises(ValueError, match=r"^head dim H=0 must be >= 1$"):          # jax.nn: scale 1/sqrt(0)
        attnlab.attention(q[..., :0], k[..., :0], v[..., :0])
    with pytest.raises(ValueError, match=r"key/value heads K=0 must be >= 1"):
        attnlab.attention(q, k[:, :, :0], v[:, :, :0])
    with pytest.raises(ValueError, match=r"key/value heads K=0 must be >= 1"):    # N = 0 may be; K = 0 may not
        attnlab.attention(q[:, :, :0], k[:, :, :0], v[:, :, :0])
    with pytest.raises(ValueError, match="implementation"):
        attnlab.attention(q, k, v, implementation="flash9000")
    with pytest.raises(ValueError, match="bias shape"):
        attnlab.attention(q, k, v, bias=jnp.ones((2, 4, 4, 3)))
    with pytest.raises(ValueError, match=r"query length T=0 must be >= 1"):    # prepare alone stays strict
        attnlab.core.prepare.prepare(q[:, :0], k, v)


@pytest.mark.parametrize("impl", ["naive", "xla"])
def test_python_list_lengths_match_jax_nn(impl):
    q, k, v = attnlab.reference.inputs.random_qkv(2, 16, 16, 2, 1, 8, "float32", seed=6)
    kw = dict(query_seq_lengths=(16, 10), key_value_seq_lengths=[16, 10])
    ours = jax.jit(lambda q, k, v: attnlab.attention(q, k, v, implementation=impl, return_residual=True, **kw))
    theirs = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, return_residual=True, **kw))
    (out, lse), (want_out, want_lse) = ours(q, k, v), theirs(q, k, v)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse[1, :10], want_lse[1, :10], rtol=1e-5, atol=1e-5)
    assert attnlab.check_close(out, q, k, v, **kw).ok
    with pytest.raises(TypeError, match=r"^key_value_seq_lengths must be an integer array, got dtype float64$"):
        attnlab.attention(q, k, v, key_value_seq_lengths=[64.0, 20.0])


@pytest.mark.parametrize("impl", ["naive", "xla"])
@pytest.mark.parametrize("scale", [0.0, -0.5])
def test_a_zero_or_negative_scale_runs_as_in_jax_nn(impl, scale):
    """jax.nn runs any finite scale (0: every visible key weighs alike); so does attention, on every path,
    against jax.nn and the float64 reference, and decode_attention's kernel too."""
    q, k, v = attnlab.reference.inputs.random_qkv(2, 16, 16, 4, 2, 16, "float32", seed=7)
    kw = dict(scale=scale, is_causal=True, key_value_seq_lengths=jnp.array([16, 9]))
    out = attnlab.attention(q, k, v, implementation=impl, **kw)
    np.testing.assert_allclose(out, jax.nn.dot_product_attention(q, k, v, **kw), rtol=1e-5, atol=1e-5)
    assert attnlab.check_close(out, q, k, v, **kw).ok
    lengths = np.array([16, 9], np.int32)
    dec = attnlab.decode_attention(q[:, :2], k, v, lengths, scale=scale, implementation="attnlab-decode")
    want = reference_decode_attention(q[:, :2], k, v, lengths, scale=scale)
    np.testing.assert_allclose(dec, want, rtol=1e-5, atol=1e-5)


def test_a_backend_not_checked_with_a_zero_scale_refuses_it(fake_backend):
    name = fake_backend("fake-positive-scale", lambda p: attnlab.backends.get("naive").run(p))
    q, k, v = attnlab.reference.inputs.random_qkv(1, 8, 8, 2, 2, 16, "float32", seed=8)
    assert attnlab.attention(q, k, v, scale=0.5, implementation=name).shape == q.shape
    with pytest.raises(attnlab.UnsupportedError, match=r"fake-positive-scale: scale <= 0: this path runs only"):
        attnlab.attention(q, k, v, scale=0.0, implementation=name)


@pytest.mark.parametrize("impl", [None, "attnlab-decode", "naive"])
def test_decode_of_an_empty_batch(impl):
    from attnlab.reference.decode64 import check_decode_close

    q, k = jnp.ones((0, 2, 4, 16)), jnp.ones((0, 16, 2, 16))
    out = attnlab.decode_attention(q, k, k, [], implementation=impl)
    assert (out.shape, out.dtype) == ((0, 2, 4, 16), q.dtype)
    assert check_decode_close(out, q, k, k, np.zeros(0, np.int32)).ok
    assert attnlab.api.decode.explain_decode(q, k, k, []).chosen == "none"


def test_one_query_one_key_bfloat16_runs_under_jit():
    """jax.jit of jax.nn's XLA path fails on the CPU for bfloat16 at T = S = 1 (jax 0.10.2; its BF16_BF16_F32 logits
    dot); attnlab's XLA path (the CPU's default) runs it, gradients too, and matches float64."""
    q, k, v = attnlab.reference.inputs.random_qkv(1, 1, 1, 1, 1, 4, "bfloat16", seed=5)
    f = jax.jit(lambda q, k, v: attnlab.attention(q, k, v, implementation="xla"))
    out = f(q, k, v)
    assert out.dtype == jnp.bfloat16 and attnlab.check_close(out, q, k, v).ok
    assert jax.jit(jax.grad(lambda q: f(q, k, v).astype(jnp.float32).sum()))(q).dtype == jnp.bfloat16


def test_a_scalar_integer_or_list_bias_and_a_list_mask_run_as_in_jax_nn():
    """jax.nn takes bias and mask through jnp.asarray: a Python scalar, a nested list, an integer or bool bias."""
    q, k, v = (jax.random.normal(jax.random.key(i), (1, 4, 2, 8)) for i in range(3))
    mask = [[[[True, False, True, True]] * 4]]                       # (1, 1, 4, 4) as nested lists
    for bias in (0.5, jnp.arange(4, dtype=jnp.int32).reshape(1, 1, 1, 4), [[1.0, 0.0, 2.0, 0.5]],
                 jnp.array([[True, False, True, True]])):
        want = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask)
        got = attnlab.attention(q, k, v, bias=bias, mask=mask, implementation="xla")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_scale_that_is_not_one_value_is_refused_by_name():
    """A vector scale of length S broadcast over the keys without a word under jit."""
    q = jnp.ones((2, 8, 4, 16))
    for scale in (np.array([0.5, 0.5]), jnp.full((8,), 0.25)):
        with pytest.raises(ValueError, match=r"scale must be a scalar .*got shape \((2|8),\)"):
            attnlab.attention(q, q, q, scale=scale)
    with pytest.raises(ValueError, match=r"scale must be a scalar .*got shape \(8,\)"):
        jax.jit(lambda s: attnlab.attention(q, q, q, scale=s))(jnp.full((8,), 0.25))
    assert jnp.allclose(jax.jit(lambda s: attnlab.attention(q, q, q, scale=s))(jnp.float32(0.25)),
                        attnlab.attention(q, q, q, scale=0.25))


@pytest.mark.parametrize("call", ["query (T, N, H), key (1, S, K, H)", "query (1, T, N, H), keys (S, K, H)",
                                  "query (N, H)", "key (S, K, H), value (1, S, K, H)", "is_causal=1",
                                  "is_causal=jnp.array(True)", "return_residual=0", "scale of shape (1,)"])
def test_calls_jax_nn_runs_with_other_ranks_and_flag_types_run_alike(call):
    """jax.nn makes each of query, key and value 4-D alone (leading sizes 1), reads flags with ``if`` and
    broadcasts a scale: the same calls run here with its result, eager and under jit."""
    q, k, v = (jax.random.normal(jax.random.key(i), (1, 4, 2, 8)) for i in range(3))
    args, kw = {
        "query (T, N, H), key (1, S, K, H)": ((q[0], k, v), {}),
        "query (1, T, N, H), keys (S, K, H)": ((q, k[0], v[0]), {}),
        "query (N, H)": ((q[0, 0], k[0], v[0]), {}),
        "key (S, K, H), value (1, S, K, H)": ((q, k[0], v), {}),
        "is_causal=1": ((q, k, v), {"is_causal": 1}),
        "is_causal=jnp.array(True)": ((q, k, v), {"is_causal": jnp.array(True)}),
        "return_residual=0": ((q, k, v), {"return_residual": 0}),
        "scale of shape (1,)": ((q, k, v), {"scale": jnp.array([0.3])}),
    }[call]
    want = jax.nn.dot_product_attention(*args, **kw)
    for got in (attnlab.attention(*args, **kw), jax.jit(lambda *a: attnlab.attention(*a, **kw))(*args)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
