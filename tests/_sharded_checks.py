"""Run in its own process with 8 virtual CPU devices (see test_sharded.py)."""
import json

import jax
import jax.numpy as jnp
import pytest

from attnlab import reference_attention, reference_attention_grads
from attnlab.reference.inputs import random_qkv
from attnlab.reference.float64 import rel_l2
from attnlab.api.sharded import make_mesh, sharded_attention, zigzag_order

assert jax.device_count() == 8, jax.devices()


# MHA and GQA (N=8); heads sharding needs a KV head a device: the GQA case on 8 devices would be the MHA one again.
# Two devices: the ring only (its one-step rotation; batch and heads split the same way on any count)
@pytest.mark.parametrize("devices, kv_heads, causal, strategy", [
    (d, kv, causal, strategy) for d in (2, 8) for kv in (8, 2) for causal in (False, True)
    for strategy in ("batch", "heads", "ring") if not (strategy == "heads" and kv < d)
    and (d == 8 or strategy == "ring")])
def test_strategy_equals_float64_reference(strategy, causal, kv_heads, devices):
    B = 8 if strategy == "batch" else 2
    q, k, v = random_qkv(B, 64, 64, 8, kv_heads, 16, "float32", seed=devices)
    mesh = make_mesh(devices)
    out = jax.jit(lambda q, k, v: sharded_attention(q, k, v, mesh=mesh, strategy=strategy, is_causal=causal))(q, k, v)
    assert out.shape == q.shape
    assert rel_l2(out, reference_attention(q, k, v, is_causal=causal)) < 1e-5


def test_ring_with_t_ne_s_non_causal():
    q, k, v = random_qkv(1, 32, 64, 4, 2, 16, "float32", seed=3)
    mesh = make_mesh(4)
    out = jax.jit(lambda q, k, v: sharded_attention(q, k, v, mesh=mesh, strategy="ring"))(q, k, v)   # eager: ~10 s
    assert rel_l2(out, reference_attention(q, k, v)) < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_through_ring(causal):
    q, k, v = random_qkv(2, 32, 32, 4, 2, 8, "float32", seed=5)
    ct = jax.random.normal(jax.random.key(1), q.shape)
    mesh = make_mesh(4)
    loss = lambda q, k, v: jnp.sum(sharded_attention(q, k, v, mesh=mesh, strategy="ring", is_causal=causal) * ct)  # noqa: E731
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    for g, r in zip(grads, reference_attention_grads(q, k, v, ct, is_causal=causal)):
        assert rel_l2(g, r) < 1e-4


def test_zigzag_layout_balances_chunks():
    order, inverse = zigzag_order(16, 2)   # 4 chunks of 4: device 0 holds 0 and 3, device 1 holds 1 and 2
    assert order.tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    assert order[inverse].tolist() == list(range(16))


def test_bf16_ring_is_close():
    q, k, v = random_qkv(1, 64, 64, 4, 4, 16, "bfloat16", seed=8)
    mesh = make_mesh(8)
    out = jax.jit(lambda q, k, v: sharded_attention(q, k, v, mesh=mesh, strategy="ring", is_causal=True))(q, k, v)
    assert out.dtype == q.dtype and rel_l2(out, reference_attention(q, k, v, is_causal=True)) < 2e-2


@pytest.mark.parametrize("kw,words", [
    (dict(strategy="ring", is_causal=True, T=36), "multiple of 8"),
    (dict(strategy="ring", T=30), "multiple of 4"),
    (dict(strategy="heads", K=2), "K=2"),
    (dict(strategy="batch", B=3), "B=3"),
    (dict(strategy="diagonal"), "strategy"),
    (dict(strategy="ring", implementation="cudnn"), "blockwise"),
])
def test_clear_errors(kw, words):
    B, T, K = kw.pop("B", 4), kw.pop("T", 32), kw.pop("K", 4)
    q, k, v = random_qkv(B, T, T, 8, K, 8, "float32")
    with pytest.raises(ValueError) as e:
        sharded_attention(q, k, v, mesh=make_mesh(4), **kw)
    assert words in str(e.value)


def test_mesh_errors():
    q, k, v = random_qkv(2, 16, 16, 4, 4, 8, "float32")
    with pytest.raises(TypeError):
        sharded_attention(q, k, v, mesh="not a mesh", strategy="batch")
    with pytest.raises(ValueError, match="devices"):
        make_mesh(9)


def test_bench_cli_with_strategy_and_scaling_command(tmp_path):
    from click.testing import CliRunner

    from attnlab.cli import main
    from attnlab.sweep.scaling import scaling_rows

    out = tmp_path / "s"
    r = CliRunner().invoke(main, ["bench", "--backends", "naive", "--batch", "2", "--seq", "32", "--heads", "2",
                                  "--head-dim", "8", "--dtype", "float32", "--devices", "1,2", "--strategy",
                                  "batch,heads,ring", "--repeats", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 6 and all(r["status"] == "ok" for r in recs), [r["reason"] for r in recs]
    assert all(r["mesh"]["devices"] == r["devices"] and r["mesh"]["strategy"] == r["strategy"] for r in recs)
    rows = scaling_rows(recs)
    assert len(rows) == 6 and all(r["efficiency"] is not None and r["efficiency"] > 0 for r in rows)
    assert all(abs(r["efficiency"] - 1) < 1e-9 for r in rows if r["devices"] == 1)
    r = CliRunner().invoke(main, ["scaling", str(out)])
    assert r.exit_code == 0 and "ring" in r.output and "%" in r.output and "backend" in r.output and "naive" in r.output
    r = CliRunner().invoke(main, ["bench", "--backends", "naive", "--strategy", "diagonal", "--out", str(out)])
    assert r.exit_code == 2 and "strategy" in r.output
