"""sharded_attention on a 1-device mesh of the GPU: every strategy compiles and matches float64."""
import jax
import pytest

from attnlab import reference_attention
from attnlab.reference.inputs import random_qkv
from attnlab.reference.float64 import check_close
from attnlab.api.sharded import make_mesh, sharded_attention

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("strategy,impl", [("batch", "cudnn"), ("heads", "cudnn"), ("batch", None), ("ring", None)])
@pytest.mark.parametrize("causal", [False, True])
def test_one_device_mesh(strategy, impl, causal):
    q, k, v = random_qkv(2, 512, 512, 8, 2, 64, "bfloat16", seed=11)
    mesh = make_mesh(1)
    fn = jax.jit(lambda q, k, v: sharded_attention(q, k, v, mesh=mesh, strategy=strategy, is_causal=causal, implementation=impl))
    out = fn(q, k, v)
    assert check_close(out, q, k, v, is_causal=causal, ref=reference_attention(q, k, v, is_causal=causal)).ok
