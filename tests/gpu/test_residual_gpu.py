"""return_residual through cuDNN on an NVIDIA GPU: jax.nn's shapes, dtypes, values and gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab.reference import cases

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("mode", ["none", "causal", "causal+padding"])
def test_cudnn_return_residual_matches_xla(mode, dtype):
    q, k, v, kw = cases.build(mode, batch=2, q_len=64, kv_len=128, heads=8, kv_heads=2, head_dim=64, dtype=dtype, seed=4)
    out, lse = jax.jit(lambda q, k, v: attnlab.attention(q, k, v, implementation="cudnn", return_residual=True, **kw))(q, k, v)
    want_out, want_lse = attnlab.attention(q, k, v, implementation="xla", return_residual=True, **kw)
    assert (lse.shape, lse.dtype) == (want_lse.shape, want_lse.dtype) == (q.shape[:-1], q.dtype)
    seen = np.asarray(want_lse, np.float32) > -1e30
    np.testing.assert_allclose(np.asarray(lse, np.float32)[seen], np.asarray(want_lse, np.float32)[seen], rtol=2e-2, atol=2e-2)
    assert attnlab.check_close(out, q, k, v, **kw).ok

    ct = jax.random.normal(jax.random.key(1), q.shape, jnp.float32).astype(dtype)

    def grads(impl):
        def f(q, k, v):
            o, l = attnlab.attention(q, k, v, implementation=impl, return_residual=True, **kw)
            return jnp.sum((o * ct).astype(jnp.float32)) + jnp.sum(jnp.where(l > -1e30, l, 0).astype(jnp.float32))
        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)

    for a, b in zip(grads("cudnn"), grads("xla")):
        assert float(attnlab.rel_l2(a, b)) < 2e-2
