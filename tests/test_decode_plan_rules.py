"""The decode kernel's plan and split rules, each value pinned (the values a mutation of its rule would change):
block sizes, warps, splits over a window, stages, refusals, products, and the ragged split count."""
import pytest

from attnlab.kernels import decode_plan as dp
from attnlab.kernels import decode_splits as ds

H200 = dict(sms=132, compute_capability=(9, 0))


@pytest.mark.parametrize("args,kw,fields,want", [
    # a short window (<= SHORT_WINDOW_MAX keys) is read in blocks of 16
    ((128, 1, 131072, 64, 8, 64, "bfloat16"), dict(window=(4096, 0)), ("block_k",), (16,)),
    # a short cache: blocks no longer than its next power of two
    ((1, 1, 20, 4, 1, 64, "bfloat16"), {}, ("block_k",), (32,)),
    # 8 warps only past 12288 = block_r x (H + block_k) (the tile that spilled at 4 warps)
    ((8, 8, 32768, 64, 8, 128, "bfloat16"), {}, ("block_r", "block_k", "num_warps"), (64, 64, 4)),
    ((1, 16, 64, 64, 8, 64, "bfloat16"), {}, ("block_r", "block_k", "num_warps"), (128, 64, 8)),
])
def test_plan_sizes(args, kw, fields, want):
    plan = dp.make_plan(*args, **H200, **kw)
    assert tuple(getattr(plan, f) for f in fields) == want


def test_splits_over_a_window_count_its_keys_and_one_block_more():
    """A 256-key window over 131072 keys splits as a 276-key cache does (window + q_len + a block's misalignment)."""
    cfg = dp.DecodeConfig(block_k=16, num_warps=1)
    windowed = dp.make_plan(1, 4, 131072, 32, 8, 64, "bfloat16", cfg, window=(256, 0), **H200)
    assert windowed.num_splits == dp.make_plan(1, 4, 276, 32, 8, 64, "bfloat16", cfg, **H200).num_splits == 2


def test_config_below_the_smallest_tiles_is_refused():
    for field in ("block_k", "block_r"):
        with pytest.raises(ValueError, match=field):
            dp.make_plan(1, 1, 64, 4, 1, 64, config=dp.DecodeConfig(**{field: 8}), sms=8)


def test_window_span_stages_refusals_and_products():
    assert dp.window_span(1000, 1, (128, 0), 64) == 168          # from the window's first key's block
    assert (dp.compiled_stages(3, 0), dp.compiled_stages(3, 1)) == (3, 5)
    assert dp.unsupported(64, 4096, 64, 8, 128, "bfloat16") is None          # at the row bound: runs
    assert dp.unsupported(4, 4, 32, 8, 128, "bfloat16") is None              # q_len = kv_len: runs
    assert dp.kv_products("float16", None, "bfloat16") is None                # no quantized cache: no products


def test_split_costs():
    assert ds.wave_cost(3, 10, 1, 3) == 6                                     # ceil(10 / 3) blocks + fill
    # an empty program still costs its fill
    assert ds.makespan([1000, 64, 16, 16], 1, 8, block_k=16, row_tiles=1, slots=1, fill_blocks=2) == 115
    # one long sequence among short ones: splits sized from the mean length, capped by the partials' traffic
    assert ds.choose_num_splits_ragged([32768] + [64] * 7, 1, uniform_choice=64, rows=16, block_k=64, head_dim=128,
                                       sm_count=132, occupancy=2) == 31
