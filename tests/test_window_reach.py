"""A window side near 2**31 (or past it) means "no limit" and gives the float64 reference's answer on every path.

jax.nn adds the window to int32 positions: at 2**31 - 1 the sum wraps and the wrong keys are masked, silently
(``jax.nn.dot_product_attention`` is shown wrong here); past 2**31 it raises OverflowError from inside jit.
attnlab caps each side at T + S_max (``core.checks.within_reach``), farther than any key from any query.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab.reference.decode64 import reference_decode_attention
from attnlab.reference.float64 import reference_attention
from attnlab.reference.serving64 import reference_serving_attention

M = 2**31 - 1
N, K, H = 4, 2, 16


def _close(out, ref):
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=2e-5, atol=2e-5)


def _normal(shape, seed):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


@pytest.mark.parametrize("impl", ["xla", "naive"])
@pytest.mark.parametrize("window,causal", [((M, M), False), ((M, 0), False), ((2, M), False), ((M, 0), True),
                                           ((2**40, 3), False)])
def test_attention(impl, window, causal):
    q, k, v = _normal((1, 8, N, H), 0), _normal((1, 12, K, H), 1), _normal((1, 12, K, H), 2)
    out = attnlab.attention(q, k, v, is_causal=causal, local_window_size=window, implementation=impl)
    _close(out, reference_attention(q, k, v, is_causal=causal, local_window_size=window))


def test_jax_nn_itself_is_wrong_there():
    """Why the cap exists: jax.nn's own answer at (2**31 - 1, 2**31 - 1) is not the unwindowed one."""
    q, k = _normal((1, 8, N, H), 0), _normal((1, 8, K, H), 1)
    wrong = jax.nn.dot_product_attention(q, k, k, local_window_size=(M, M))
    assert not np.allclose(np.asarray(wrong), reference_attention(q, k, k), atol=1e-3)


@pytest.mark.parametrize("impl", ["xla", "attnlab-decode"])
def test_decode(impl):
    q, kc, vc = _normal((2, 2, N, H), 3), _normal((2, 32, K, H), 4), _normal((2, 32, K, H), 5)
    lengths = np.array([5, 30], np.int32)
    out = attnlab.decode_attention(q, kc, vc, lengths, local_window_size=(M, M), implementation=impl)
    _close(out, reference_decode_attention(q, kc, vc, lengths))


@pytest.mark.parametrize("impl", ["xla", "attnlab-decode"])
def test_serving_with_its_plan(impl):
    q, kc, vc = _normal((8, N, H), 6), _normal((2, 32, K, H), 7), _normal((2, 32, K, H), 8)
    starts, lengths = np.array([0, 3, 5], np.int32), np.array([10, 30], np.int32)
    plan = None if impl == "xla" else attnlab.serving_plan(starts, lengths, total_tokens=8, kv_len_max=32, heads=N,
                                                           kv_heads=K, head_dim=H, dtype="float32",
                                                           local_window_size=M)
    out = attnlab.serving_attention(q, kc, vc, starts, lengths, local_window_size=M, plan=plan, implementation=impl)
    ref = reference_serving_attention(q, kc, vc, starts, lengths)
    _close(np.asarray(out)[:5], np.asarray(ref)[:5])
