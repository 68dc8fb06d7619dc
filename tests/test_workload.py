import pytest

from attnlab import Workload
from attnlab.core.workload import kv_cache_bytes


def test_dense_flops_and_bytes():
    w = Workload(2, 128, 256, 8, 2, 64, "bfloat16")
    assert w.flops() == 4 * 2 * 8 * 128 * 256 * 64
    assert w.flops("bwd") == 2.5 * w.flops()
    assert w.flops("fwd+bwd") == 3.5 * w.flops()
    assert w.bytes() == (2 * 2 * 128 * 8 * 64 + 2 * 2 * 256 * 2 * 64) * 2


def test_causal_counts_kept_entries():
    w = Workload(1, 1024, 1024, 4, 4, 64, causal=True)
    assert w.kept_pairs() == 1024 * 1025 // 2
    assert abs(w.flops() / Workload(1, 1024, 1024, 4, 4, 64).flops() - 0.5) < 0.001


def test_window_and_lengths():
    w = Workload(1, 8, 8, 1, 1, 8, causal=True, window=(2, 0))
    assert w.kept_pairs() == 1 + 2 + 3 * 6
    w = Workload(2, 4, 6, 1, 1, 8, q_lengths=(2, 4), kv_lengths=(3, 6))
    assert w.kept_pairs() == 2 * 3 + 4 * 6


def test_kv_cache_and_intensity():
    w = Workload(1, 1, 4096, 32, 8, 128, "bfloat16")
    assert kv_cache_bytes(layers=1, kv_heads=8, head_dim=128, context=1) == 2 * 8 * 128 * 2
    # by hand: FLOPs 4 N H S = 4*32*128*4096 = 67_108_864; bytes: q and out 2 * 32*128*2 = 16_384,
    # K and V 2 * 4096*8*128*2 = 16_777_216, together 16_793_600; 67_108_864 / 16_793_600 = 3.99610
    assert w.flops() == 67_108_864 and w.bytes() == 16_793_600
    assert w.intensity() == pytest.approx(3.99610, abs=1e-5)


@pytest.mark.parametrize("kw", [dict(batch=0), dict(heads=6, kv_heads=4), dict(dtype="int9"), dict(window=(-1, 0)),
                                dict(q_lengths=(1,))])
def test_bad_workload(kw):
    base = dict(batch=2, q_len=4, kv_len=4, heads=4, kv_heads=2, head_dim=8)
    base.update(kw)
    with pytest.raises((ValueError, TypeError)):
        Workload(**base)
