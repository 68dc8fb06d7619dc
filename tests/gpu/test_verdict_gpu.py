"""The verdict's rules on an NVIDIA GPU (attnlab.reference.rules): cuDNN's and XLA's rows that see no key and
their lse pass ``check_close`` and a sweep's check by the one rule; padded rows' lse too. Prints each note."""
import jax
import jax.numpy as jnp
import pytest

import attnlab
from attnlab.measure import check
from attnlab.reference import cases
from attnlab.reference.inputs import random_qkv

pytestmark = pytest.mark.gpu

T = 128
EMPTY = dict(is_causal=True, local_window_size=(16, 2), key_value_seq_lengths=jnp.asarray([T, 20], jnp.int32))


def _run(impl, q, k, v, **kw):
    fn = jax.jit(lambda q, k, v: attnlab.attention(q, k, v, implementation=impl, return_residual=True, **kw))
    try:
        return fn(q, k, v)
    except attnlab.UnsupportedError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("impl", ["cudnn", "xla"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rows_that_see_no_key_pass_by_the_rule_on_the_gpu(impl, dtype):
    q, k, v = random_qkv(2, T, T, 8, 2, 64, dtype, seed=4)
    out, lse = _run(impl, q, k, v, **EMPTY)
    verdict = attnlab.check_close((out, lse), q, k, v, return_residual=True, **EMPTY)
    print(impl, dtype, verdict.note, "lse err", verdict.lse_err, "limit", verdict.lse_limit)
    assert verdict.ok, verdict
    assert verdict.empty_rows == T - 36
    sem = check.Semantics(causal=True, window=(16, 2), kv_lengths=(T, 20))
    rec = check.check_forward(out, q, k, v, sem, ref_key=f"gpu-empty-{impl}-{dtype}")
    assert rec["ok"], rec["reason"]


@pytest.mark.parametrize("impl", ["cudnn", "xla"])
@pytest.mark.parametrize("mode", ["causal+padding", "causal"])
def test_lse_of_padded_rows_passes_on_the_gpu(impl, mode):
    q, k, v, kw = cases.build(mode, batch=2, q_len=64, kv_len=128, heads=8, kv_heads=2, head_dim=64, dtype="bfloat16",
                              seed=4)
    out, lse = _run(impl, q, k, v, **kw)
    verdict = attnlab.check_close((out, lse), q, k, v, return_residual=True, **kw)
    assert verdict.ok, verdict
