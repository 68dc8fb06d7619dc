"""Issue 25 on an NVIDIA GPU: every group size, paged caches (attnlab-decode and cuDNN's paged attention),
256-row tiles, and cuDNN's forward call with a mask at odd T, all against float64.

    python -m pytest -q -m gpu tests/gpu/test_decode_paged_gpu.py
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab import backends
from attnlab.reference.inputs import random_qkv
from attnlab.kernels import decode as kd
from attnlab.kernels import pages as kp
from attnlab.reference.decode64 import check_decode_close

pytestmark = pytest.mark.gpu
S = 1024
LENGTHS = [S, 4 + 17, S // 2 + 3, 77]


def _need(name):
    why = backends.get(name).available()
    if why:
        pytest.skip(f"{name}: {why}")


def _lengths(T):
    return [max(T, n) for n in LENGTHS]


@pytest.mark.parametrize("G", list(range(1, 17)))
def test_every_group_size(G):
    _need("attnlab-decode")
    T, K, H = 4, 2, (64, 128, 256)[G % 3]
    q, k, v = random_qkv(4, T, S, G * K, K, H, "bfloat16", seed=G)
    lengths = _lengths(T)
    f = jax.jit(functools.partial(attnlab.decode_attention, implementation="attnlab-decode"))
    out = f(q, k, v, jnp.asarray(lengths, jnp.int32))
    verdict = check_decode_close(out, q, k, v, lengths)
    assert verdict.ok, (G, verdict)


@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
@pytest.mark.parametrize("T, N, K, H", [(1, 32, 8, 128), (4, 28, 4, 128), (16, 64, 4, 128), (3, 16, 8, 256),
                                        (8, 8, 8, 64)])
def test_paged_kernel(page_size, T, N, K, H):
    _need("attnlab-decode")
    q, k, v = random_qkv(4, T, S, N, K, H, "bfloat16", seed=T + page_size)
    lengths = _lengths(T)
    kpg, vpg, table = kp.to_pages(k, v, page_size, seed=page_size)
    table = np.asarray(table).copy()
    for b, n in enumerate(kp.pages_in_use(lengths, page_size)):
        table[b, n:] = -1                                  # unused slots hold garbage
    f = jax.jit(functools.partial(attnlab.decode_attention, implementation="attnlab-decode"))
    out = f(q, kpg, vpg, jnp.asarray(lengths, jnp.int32), page_table=jnp.asarray(table))
    verdict = check_decode_close(out, q, k, v, lengths)
    assert verdict.ok, verdict


@pytest.mark.parametrize("T", [1, 4])
def test_cudnn_paged(T):
    _need("cudnn")
    q, k, v = random_qkv(4, T, S, 32, 8, 128, "bfloat16", seed=T)
    lengths = _lengths(T)
    kpg, vpg, table = kp.to_pages(k, v, 16, seed=1)
    f = jax.jit(functools.partial(attnlab.decode_attention, implementation="cudnn"))
    out = f(q, kpg, vpg, jnp.asarray(lengths, jnp.int32), page_table=jnp.asarray(table))
    verdict = check_decode_close(out, q, k, v, lengths)
    assert verdict.ok, verdict


@pytest.mark.parametrize("T, N, K", [(64, 32, 8), (32, 64, 8), (32, 28, 4)])
@pytest.mark.parametrize("block_k", [16, 32])
def test_256_row_tiles(T, N, K, block_k):
    _need("attnlab-decode")
    q, k, v = random_qkv(4, T, S, N, K, 128, "bfloat16", seed=T)
    lengths = _lengths(T)
    cfg = kd.DecodeConfig(block_r=256, block_k=block_k, num_warps=8)
    out = kd.decode_attention_pallas(q, k, v, jnp.asarray(lengths), causal=True, config=cfg)
    verdict = check_decode_close(out, q, k, v, lengths)
    assert verdict.ok, verdict


@pytest.mark.parametrize("T", [3, 5])
def test_cudnn_forward_with_a_mask_at_odd_T(T):
    _need("cudnn")
    q, k, v = random_qkv(4, T, S, 32, 8, 128, "bfloat16", seed=T)
    lengths = _lengths(T)
    out = jax.jit(functools.partial(attnlab.decode_attention, implementation="cudnn"))(
        q, k, v, jnp.asarray(lengths, jnp.int32))
    verdict = check_decode_close(out, q, k, v, lengths)
    assert verdict.ok, verdict
    mask = jnp.ones((4, 1, T, S), bool)
    with pytest.raises(attnlab.UnsupportedError, match="backward pass: a bias or mask needs even"):
        jax.grad(lambda q: attnlab.attention(q, k, v, mask=mask, implementation="cudnn").astype(jnp.float32).sum())(q)


@pytest.mark.parametrize("backend", ["attnlab-decode", "cudnn"])
def test_paged_sweep_cells(backend):
    from attnlab.measure import Cell, Options, measure_cell

    _need(backend)
    cell = Cell(backend, 2, 4, 4096, 32, 8, 128, "bfloat16", causal=True, lengths="paged", page_size=64)
    rec = measure_cell(cell, Options(repeats=3))
    assert rec["status"] == "ok", rec["reason"]
    assert rec["checked_fraction"] == 1.0 and rec["timer"] == "cupti" and rec["page_size"] == 64
