"""Decode kernel (interpret mode): every group size 1-16 (odd ones too) at head dims 64/128/256,
rows past T*G masked, and nothing padded to a power of two in memory (issue 25, item 2)."""
import functools

import jax
import jax.numpy as jnp
import pytest

from attnlab.reference.inputs import random_qkv
from attnlab.kernels import decode as kd
from attnlab.reference.decode64 import check_decode_close

HEAD_DIMS = (64, 128, 256)


@pytest.mark.parametrize("G", range(1, 17))
def test_every_group_size_matches_float64(G):
    """G = N / K query heads per KV head, 1..16; T*G crosses the 16-row MMA minimum for most of them. Odd G in one
    split (O stored directly, its rows scattered to (t, g): ``kernels.decode_direct``), even G in two."""
    H = HEAD_DIMS[G % 3]
    T = 1 + G % 3                     # T*G from 1 (G=1... T=2) to 48 rows, rarely a power of two
    K = 2 if G <= 8 else 1
    lengths = [40, T + 3]
    q, k, v = random_qkv(2, T, 40, G * K, K, H, "bfloat16", seed=G)
    out = kd.decode_attention_pallas(q, k, v, jnp.asarray(lengths), causal=True, interpret=True,
                                     config=kd.DecodeConfig(block_k=16, num_splits=1 + (G % 2 == 0)))
    verdict = check_decode_close(out, q, k, v, lengths, causal=True)
    assert verdict.ok, (G, T, H, verdict)


def _pallas_shapes(T, N, K, H, **cfg):
    """(input shapes, output shapes) of the decode kernel's pallas_call for B=2, S=64."""
    q, k, v = random_qkv(2, T, 64, N, K, H, "bfloat16")
    f = functools.partial(kd.decode_attention_pallas, causal=True, interpret=True,
                          config=kd.DecodeConfig(**cfg) if cfg else None)
    jaxpr = jax.make_jaxpr(f)(q, k, v, jnp.array([64, 9]))
    (eqn,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"]
    return [tuple(x.aval.shape) for x in eqn.invars], [tuple(x.aval.shape) for x in eqn.outvars]


@pytest.mark.parametrize("T, N, K", [(3, 7, 1), (1, 5, 1), (5, 6, 2), (2, 12, 4)])
def test_rows_are_not_padded_to_a_power_of_two_in_memory(T, N, K):
    """q's rows (B, K, T*G, H) and the partial outputs hold exactly T*G rows; the tile's rows past
    them (block_r is a power of two) are masked loads and stores, not memory. One split stored directly
    (``kernels.decode_direct``): q and O as (B, T, K, G, H) views of (B, T, N, H), no partials."""
    rows, G = T * (N // K), N // K
    ins, outs = _pallas_shapes(T, N, K, 64, direct_output=False)
    plan = kd.make_plan(2, T, 64, N, K, 64, "bfloat16", kd.DecodeConfig(direct_output=True), sms=kd.CPU_SM_COUNT)
    assert plan.block_r > rows                         # the tile is padded, the arrays are not
    assert ins[1] == (2, K, rows, 64)
    assert outs[0][-2:] == (rows, 64) and outs[1][-1] == rows and outs[2][-1] == rows
    assert plan.direct                                 # one split, O stored directly
    ins, outs = _pallas_shapes(T, N, K, 64, direct_output=True)
    assert ins[1] == (2, T, K, G, 64) and outs == [(2, T, K, G, 64)]


def test_head_dims_and_group_sizes_are_supported():
    for H in HEAD_DIMS:
        for G in range(1, 17):
            assert kd.unsupported(4, 1024, 8 * G, 8, H, "bfloat16") is None
    assert "not supported" in kd.unsupported(4, 1024, 8, 8, 96, "bfloat16")
