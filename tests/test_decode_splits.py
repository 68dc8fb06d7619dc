"""Ragged split counts (issue 25, item 4): the grid simulated with each sequence's own length."""
import jax
import jax.numpy as jnp
import pytest

from attnlab.reference.inputs import random_qkv
from attnlab.kernels import decode as kd
from attnlab.kernels.decode_splits import choose_num_splits_ragged, makespan
from attnlab.measure.cell import Cell
from attnlab.reference.decode64 import check_decode_close

KW = dict(rows=4, block_k=64, head_dim=128, sm_count=132, occupancy=3)


def test_makespan_of_a_uniform_batch_is_the_wave_model():
    for B, K, S, splits in ((8, 8, 32768, 8), (4, 2, 4096, 4), (1, 8, 131072, 32)):
        n_blocks = S // 64
        got = makespan([S] * B, K, splits, block_k=64, row_tiles=1, slots=396, fill_blocks=kd.FILL_BLOCKS)
        assert got == kd.wave_cost(splits, n_blocks, B * K, 396)


@pytest.mark.parametrize("T", [1, 4, 16])
def test_a_ragged_batch_gets_a_split_count_no_worse_in_the_model(T):
    lengths = Cell("x", 8, T, 32768, 32, 8, 128, "bfloat16", True, lengths="ragged").kv_lengths()
    uniform = kd.make_plan(8, T, 32768, 32, 8, 128, sms=132, compute_capability=(9, 0))
    ragged = kd.make_plan(8, T, 32768, 32, 8, 128, sms=132, compute_capability=(9, 0), lengths=lengths)
    slots = 132 * kd.programs_per_sm(uniform.block_r, uniform.block_k, 128, uniform.num_warps, uniform.num_stages)
    span = lambda s: makespan(lengths, 8, s, block_k=uniform.block_k, row_tiles=1, slots=slots,  # noqa: E731
                              fill_blocks=kd.FILL_BLOCKS)
    assert span(ragged.num_splits) < span(uniform.num_splits)
    assert ragged.num_splits > uniform.num_splits      # the longest sequences are cut finer


def test_uniform_lengths_keep_the_s_max_rule():
    for T in (1, 4, 16, 64):
        a = kd.make_plan(8, T, 32768, 32, 8, 128, sms=132)
        b = kd.make_plan(8, T, 32768, 32, 8, 128, sms=132, lengths=[32768] * 8)
        assert a == b
    assert choose_num_splits_ragged([100] * 4, 8, uniform_choice=5, **KW) == 5


def test_kernel_with_concrete_ragged_lengths_and_default_plan_matches_float64():
    q, k, v = random_qkv(3, 2, 512, 8, 2, 64, "bfloat16", seed=1)
    lengths = [512, 2, 77]
    out = kd.decode_attention_pallas(q, k, v, jnp.asarray(lengths), causal=True, interpret=True)
    assert check_decode_close(out, q, k, v, lengths).ok
    f = jax.jit(lambda n: kd.decode_attention_pallas(q, k, v, n, causal=True, interpret=True))
    assert check_decode_close(f(jnp.asarray(lengths)), q, k, v, lengths).ok      # traced: the S_max rule
