"""cuDNN FP8 attention on the GPU: it engages (e4m3 in the program), and its error against float64."""
import jax
import pytest

import attnlab
from attnlab.reference.inputs import random_qkv
from attnlab.reference.float64 import check_close

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["cudnn-fp8", "cudnn-fp8-unit"])
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_fp8_forward(name, causal):
    q, k, v = random_qkv(2, 512, 512, 4, 4, 128, "bfloat16", seed=1)
    fn = lambda q, k, v: attnlab.attention(q, k, v, is_causal=causal, implementation=name)  # noqa: E731
    text = jax.jit(fn).lower(q, k, v).as_text()
    assert "f8E4M3FN" in text and "__cudnn$fmha" in text
    out = jax.jit(fn)(q, k, v)
    assert out.dtype == q.dtype
    v_ = check_close(out, q, k, v, is_causal=causal, limit=0.1, rule="fp8")
    assert v_.ok, v_


def test_amax_scaling_is_no_worse_than_unit_scales():
    q, k, v = random_qkv(1, 1024, 1024, 4, 4, 128, "bfloat16", seed=2)
    errs = {n: check_close(attnlab.attention(q, k, v, implementation=n), q, k, v, limit=1, rule="").rel_err
            for n in ("cudnn-fp8", "cudnn-fp8-unit")}
    assert errs["cudnn-fp8"] <= errs["cudnn-fp8-unit"] * 1.05, errs


RECIPE_BACKENDS = ["cudnn-fp8-pow2", "cudnn-fp8-s256", "cudnn-fp8-s1", "cudnn-fp8-hadamard", "cudnn-fp8-hadamard-f32",
                   "cudnn-fp8-hadamard-fused", "cudnn-fp8-smoothk", "cudnn-fp8-hadamard-smoothk"]


@pytest.mark.parametrize("name", RECIPE_BACKENDS)
def test_every_fp8_recipe_runs_e4m3_on_cudnn(name):
    q, k, v = random_qkv(1, 512, 512, 4, 4, 128, "bfloat16", seed=3)
    fn = lambda q, k, v: attnlab.attention(q, k, v, is_causal=True, implementation=name)  # noqa: E731
    text = jax.jit(fn).lower(q, k, v).as_text()
    assert "f8E4M3FN" in text and "__cudnn$fmha" in text
    v_ = check_close(jax.jit(fn)(q, k, v), q, k, v, is_causal=True, limit=0.1, rule="fp8")
    assert v_.ok, v_


def test_hadamard_lowers_the_error_on_channel_outliers():
    import jax.numpy as jnp

    from attnlab.reference.distributions import make_qkv

    q, k, v = (jnp.asarray(x).astype(jnp.bfloat16) for x in make_qkv("channel-outliers", 1, 1024, 1024, 4, 4, 128, seed=0))
    errs = {n: check_close(attnlab.attention(q, k, v, implementation=n), q, k, v, limit=1, rule="").rel_err
            for n in ("cudnn-fp8", "cudnn-fp8-hadamard", "cudnn-fp8-hadamard-f32", "cudnn-fp8-hadamard-fused")}
    for n in ("cudnn-fp8-hadamard", "cudnn-fp8-hadamard-f32", "cudnn-fp8-hadamard-fused"):
        assert errs[n] < 0.7 * errs["cudnn-fp8"], errs
