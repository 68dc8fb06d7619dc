"""The Mosaic GPU (wgmma) decode kernel on the CPU: JAX's GPU interpreter against float64, the plan's
choice of kernel, and a compile check for sm_90 (lowering, shared memory) without a GPU (issue 25)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnlab.kernels import decode as kd
from attnlab.kernels import decode_mgpu as dm
from attnlab.kernels import pages as kp
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.inputs import random_qkv


@pytest.mark.parametrize("T, N, K, H, lengths, causal, splits", [
    (3, 14, 2, 64, [256, 70], True, 2),     # G = 7, a short sequence's masked tail, a split with no key
    (5, 4, 1, 64, [192, 5], False, 3),      # without the causal rule; three splits
])
def test_interpreter_matches_float64(T, N, K, H, lengths, causal, splits):
    q, k, v = random_qkv(2, T, 256, N, K, H, "bfloat16", seed=T)
    plan = dm.make_mgpu_plan(2, T, 256, N, K, H, block_kv=64, num_splits=splits)
    out = dm.decode_attention_mgpu(q, k, v, jnp.asarray(lengths), causal=causal, plan=plan, interpret=True)
    verdict = check_decode_close(out, q, k, v, lengths, causal=causal)
    assert verdict.ok, verdict


@pytest.mark.parametrize("page_size", [16, 128])
def test_interpreter_paged_matches_its_contiguous_twin(page_size):
    """One TMA copy per page of 16 (four a 64-key step), or a 64-key step inside a page of 128; table
    slots past a sequence's pages hold -1."""
    q, k, v = random_qkv(2, 4, 128, 4, 1, 64, "bfloat16", seed=page_size)
    lengths = [128, 37]
    kp_, vp_, table = kp.to_pages(k, v, page_size)
    table = np.asarray(table).copy()
    table[1, kp.pages_in_use([37], page_size)[0]:] = -1
    plan = dm.make_mgpu_plan(2, 4, 128, 4, 1, 64, block_kv=64, num_splits=2)
    out = dm.decode_attention_mgpu(q, kp_, vp_, jnp.asarray(lengths), plan=plan, interpret=True,
                                   page_table=jnp.asarray(table))
    verdict = check_decode_close(out, q, k, v, lengths)
    assert verdict.ok, verdict


def test_the_plan_picks_mosaic_above_64_rows_on_hopper_only():
    pick = dm.pick_kernel
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=(9, 0)) == "mosaic"     # 112 rows
    assert pick(16, 32768, 32, 8, 128, "bfloat16", compute_capability=(9, 0)) == "triton"     # 64 rows
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=(8, 0)) == "triton"
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=None) == "triton"       # CPU
    assert pick(16, 32768, 28, 4, 256, "bfloat16", compute_capability=(9, 0)) == "triton"
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=(9, 0), page_size=16) == "mosaic"
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=(9, 0), page_size=8) == "triton"
    assert pick(16, 32768, 28, 4, 128, "bfloat16", compute_capability=(9, 0), soft_cap=30.0) == "triton"
    assert pick(16, 32768, 28, 4, 128, "float32", compute_capability=(9, 0)) == "triton"
    assert pick(2, 1024, 8, 8, 64, "float16", compute_capability=(9, 0), requested="mosaic") == "mosaic"
    with pytest.raises(ValueError, match="head dim 256"):
        pick(2, 1024, 8, 8, 256, "bfloat16", compute_capability=(9, 0), requested="mosaic")
    with pytest.raises(ValueError, match="kernel must be"):
        pick(2, 1024, 8, 8, 64, "bfloat16", compute_capability=(9, 0), requested="cuda")


def test_decode_attention_pallas_runs_the_requested_mosaic_kernel():
    q, k, v = random_qkv(1, 2, 128, 4, 1, 64, "float16", seed=0)

    def run(kernel):
        return kd.decode_attention_pallas(q, k, v, jnp.asarray([100]), interpret=True,
                                          config=kd.DecodeConfig(kernel=kernel))
    # the Mosaic GPU kernel runs in JAX's GPU interpreter, the Triton one under its own name
    assert "InterpretGPUParams" in str(jax.make_jaxpr(lambda: run("mosaic"))())
    assert "attnlab_decode_r" in str(jax.make_jaxpr(lambda: run("triton"))())
    assert check_decode_close(run("mosaic"), q, k, v, [100]).ok


@pytest.mark.parametrize("T, N, K, H", [(16, 28, 4, 128), (64, 32, 8, 128), (32, 64, 4, 128), (8, 64, 8, 64)])
def test_default_plans_lower_for_sm90_within_shared_memory(T, N, K, H):
    """Mosaic GPU checks shared memory when it lowers: every default plan of the grid fits 227 KB."""
    B, S = 8, 32768
    plan = dm.make_mgpu_plan(B, T, S, N, K, H)
    q = jax.ShapeDtypeStruct((B, T, N, H), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((B, S, K, H), jnp.bfloat16)
    with kd.cuda_lowering_context():
        text = jax.jit(lambda q, k, v, n: dm.decode_attention_mgpu(q, k, v, n, plan=plan)).trace(
            q, kv, kv, jax.ShapeDtypeStruct((B,), jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text
    assert plan.row_tiles == -(-T * (N // K) // 128) and plan.block_kv == 128


def test_a_plan_past_shared_memory_is_refused():
    with pytest.raises(ValueError, match="exceed shared memory"):
        dm.make_mgpu_plan(8, 16, 32768, 28, 4, 128, block_kv=128, max_steps=3)
