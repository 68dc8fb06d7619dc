"""attnlab's decode kernel compiled by Triton on an NVIDIA GPU, against float64; peers at the decode rule.

    python -m pytest -q -m gpu tests/gpu/test_decode_gpu.py
"""
import functools

import jax
import jax.numpy as jnp
import pytest

import attnlab
from attnlab import backends
from attnlab.reference.inputs import random_qkv
from attnlab.kernels import decode as kd
from attnlab.reference.decode64 import check_decode_close

pytestmark = pytest.mark.gpu
S = 1024


def _need(name):
    why = backends.get(name).available()
    if why:
        pytest.skip(f"{name}: {why}")


def _lengths(B, T, S, ragged):
    # ragged: one full cache, one of exactly T, others in between and not multiples of any block
    return [S] * B if not ragged else [S, T, max(T, S // 2 + 3), max(T, 77)][:B]


def _decode(q, k, v, lengths, causal=True):
    f = jax.jit(functools.partial(attnlab.decode_attention, causal=causal, implementation="attnlab-decode"))
    return f(q, k, v, jnp.asarray(lengths, jnp.int32))


@pytest.mark.parametrize("T", [1, 4, 16, 64])
@pytest.mark.parametrize("H", [64, 128, 256])
@pytest.mark.parametrize("heads", [(32, 8), (8, 1)], ids=["gqa32-8", "gqa8-1"])
@pytest.mark.parametrize("ragged", [True, False], ids=["ragged", "uniform"])
def test_kernel_matches_float64_bf16(T, H, heads, ragged):
    _need("attnlab-decode")
    N, K = heads
    B = 4
    q, k, v = random_qkv(B, T, S, N, K, H, "bfloat16", seed=T + H)
    lengths = _lengths(B, T, S, ragged)
    out = _decode(q, k, v, lengths)
    verdict = check_decode_close(out, q, k, v, lengths, causal=True)
    assert verdict.ok, verdict


@pytest.mark.parametrize("T", [1, 4, 16, 64])
@pytest.mark.parametrize("causal", [True, False])
def test_kernel_matches_float64_fp16(T, causal):
    _need("attnlab-decode")
    q, k, v = random_qkv(3, T, S, 32, 8, 128, "float16", seed=T)
    lengths = _lengths(3, T, S, True)
    out = _decode(q, k, v, lengths, causal=causal)
    verdict = check_decode_close(out, q, k, v, lengths, causal=causal)
    assert verdict.ok, verdict


@pytest.mark.parametrize("cfg", [dict(block_k=32, num_stages=2), dict(block_k=128, num_stages=4),
                                 dict(num_warps=8), dict(num_splits=1), dict(num_splits=37), dict(block_r=16)])
def test_tuning_variants_stay_correct(cfg):
    _need("attnlab-decode")
    B, T = 4, 16
    q, k, v = random_qkv(B, T, S, 32, 8, 128, "bfloat16", seed=5)
    lengths = _lengths(B, T, S, True)
    out = kd.decode_attention_pallas(q, k, v, jnp.asarray(lengths), causal=True, config=kd.DecodeConfig(**cfg))
    verdict = check_decode_close(out, q, k, v, lengths, causal=True)
    assert verdict.ok, (cfg, verdict)


def test_kernel_never_reads_past_lengths_on_gpu():
    _need("attnlab-decode")
    B, T = 4, 4
    q, k, v = random_qkv(B, T, S, 32, 8, 128, "bfloat16", seed=9)
    lengths = _lengths(B, T, S, True)
    past = (jnp.arange(S)[None, :] >= jnp.array(lengths)[:, None])[:, :, None, None]
    out = _decode(q, jnp.where(past, jnp.nan, k), jnp.where(past, jnp.nan, v), lengths)
    assert bool(jnp.all(jnp.isfinite(out)))
    assert check_decode_close(out, q, k, v, lengths).ok


def test_kernel_through_attention_with_kv_lengths():
    _need("attnlab-decode")
    q, k, v = random_qkv(4, 2, S, 32, 8, 128, "bfloat16", seed=2)
    n = jnp.array(_lengths(4, 2, S, True), jnp.int32)
    out = jax.jit(lambda q, k, v, n: attnlab.attention(q, k, v, key_value_seq_lengths=n,
                                                       implementation="attnlab-decode"))(q, k, v, n)
    assert attnlab.check_close(out, q, k, v, key_value_seq_lengths=n).ok


@pytest.mark.parametrize("impl", ["cudnn", "xla"])
@pytest.mark.parametrize("T", [1, 4])
def test_peers_at_the_decode_rule(impl, T):
    _need(impl)
    q, k, v = random_qkv(4, T, S, 32, 8, 128, "bfloat16", seed=3)
    lengths = _lengths(4, T, S, True)
    out = jax.jit(functools.partial(attnlab.decode_attention, causal=True, implementation=impl))(
        q, k, v, jnp.asarray(lengths, jnp.int32))
    verdict = check_decode_close(out, q, k, v, lengths, causal=True)
    assert verdict.ok, verdict


@pytest.mark.parametrize("heads", [(32, 8), (8, 1)], ids=["gqa32-8", "gqa8-1"])
def test_pallas_paged_at_t1(heads):
    _need("pallas-paged")
    N, K = heads
    q, k, v = random_qkv(4, 1, S, N, K, 128, "bfloat16", seed=4)
    n = jnp.array(_lengths(4, 1, S, True), jnp.int32)
    out = jax.jit(lambda q, k, v, n: attnlab.attention(q, k, v, key_value_seq_lengths=n,
                                                       implementation="pallas-paged"))(q, k, v, n)
    verdict = attnlab.check_close(out, q, k, v, key_value_seq_lengths=n)
    assert verdict.ok, verdict
    via_decode = attnlab.decode_attention(q, k, v, n, implementation="pallas-paged")   # T = 1: no mask needed
    assert check_decode_close(via_decode, q, k, v, n).ok


def test_sm_count_on_this_gpu():
    n = kd.sm_count()
    assert n > 0
    if "H200" in jax.devices()[0].device_kind or "H100 80GB" in jax.devices()[0].device_kind:
        assert n == 132


@pytest.mark.parametrize("backend", ["attnlab-decode", "cudnn", "torch-cudnn", "torch-flash", "torch-efficient"])
@pytest.mark.parametrize("lengths", ["full", "ragged"])
def test_decode_sweep_cells_checked_and_cupti_timed(backend, lengths):
    """Decode cells through the sweep engine: every peer checked on the whole output at the decode
    rule (PyTorch's too, lower-right causal), then timed by CUPTI; refusals name the reason."""
    from attnlab.measure import Cell, Options, measure_cell

    _need(backend)
    cell = Cell(backend, 2, 8, 4096, 32, 8, 128, "bfloat16", causal=True, lengths=lengths)
    rec = measure_cell(cell, Options(repeats=3))
    if backend == "torch-flash" and lengths == "ragged":
        assert rec["status"] == "unsupported" and "ragged" in rec["reason"]
        return
    if backend == "torch-efficient":
        assert rec["status"] == "unsupported" and "grouped" in rec["reason"], rec["reason"]
        return
    assert rec["status"] == "ok", rec["reason"]
    assert rec["checked_fraction"] == 1.0 and rec["margin"] > 1
    assert rec["timer"] == "cupti" and rec["kernel_ms"] > 0
    assert rec["pct_roofline"] > 0 and rec["pct_bandwidth"] > 0
