"""attnlab.reference.distributions (issue 15's inputs) and attnlab.reference.fp8_emulation (e4m3 rounding in float64 attention)."""
from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from attnlab.reference import fp8_emulation as emu
from attnlab.reference.distributions import (CHANNEL_GAIN, DISTRIBUTIONS, KEY_SHIFT, OUTLIER_FRACTION, key_shift, make_qkv,
                                   outlier_channels)
from attnlab.reference.inputs import random_qkv
from attnlab.reference.float64 import reference_attention

SHAPE = (1, 128, 128, 2, 2, 128)          # B, T, S, N, K, H


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_seeded_and_reproducible(dist):
    a = make_qkv(dist, *SHAPE, "float32", 3)
    b = make_qkv(dist, *SHAPE, "float32", 3)
    c = make_qkv(dist, *SHAPE, "float32", 4)
    for x, y, z in zip(a, b, c):
        assert isinstance(x, np.ndarray) and x.dtype == np.float32
        np.testing.assert_array_equal(x, y)
        assert not np.array_equal(x, z)
    assert a[0].shape == (1, 128, 2, 128) and a[1].shape == a[2].shape == (1, 128, 2, 128)


def test_gaussian_is_random_qkv():
    for dtype in ("float32", "bfloat16"):
        for x, y in zip(make_qkv("gaussian", *SHAPE, dtype, 5), random_qkv(*SHAPE, dtype, 5)):
            assert x.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(x, np.asarray(y))


def test_unknown_distribution():
    with pytest.raises(ValueError, match="unknown distribution"):
        make_qkv("uniform", *SHAPE)


def test_outliers_fraction_and_size():
    g = make_qkv("gaussian", 1, 1024, 1024, 4, 4, 128, "float32", 0)
    o = make_qkv("outliers", 1, 1024, 1024, 4, 4, 128, "float32", 0)
    for x, y in zip(g, o):
        changed = x != y
        frac = changed.mean()                        # 524288 entries: 0.1% +- 0.0044%
        assert abs(frac - OUTLIER_FRACTION) < 2e-4, frac
        assert 8 < y[changed].std() < 12             # drawn from N(0, 10^2)
        assert abs(np.abs(y).max()) > 25             # ~ 4 sigma of the big ones


def test_channel_outliers():
    g = make_qkv("gaussian", *SHAPE, "float32", 1)
    c = make_qkv("channel-outliers", *SHAPE, "float32", 1)
    ch = outlier_channels(128, 1)
    assert len(ch) == 4 and len(set(ch)) == 4
    assert not np.array_equal(ch, outlier_channels(128, 2))
    others = np.setdiff1d(np.arange(128), ch)
    for x, y in zip(g[:2], c[:2]):                   # q and k: x20 on the 4 channels, unchanged elsewhere
        np.testing.assert_allclose(y[..., ch], CHANNEL_GAIN * x[..., ch], rtol=1e-6)
        np.testing.assert_array_equal(y[..., others], x[..., others])
    np.testing.assert_array_equal(g[2], c[2])       # v unchanged


def test_shifted_keys_mean():
    g = make_qkv("gaussian", 1, 1024, 1024, 2, 2, 128, "float32", 0)
    s = make_qkv("shifted-keys", 1, 1024, 1024, 2, 2, 128, "float32", 0)
    mu = key_shift(2, 128, 0)
    np.testing.assert_allclose(np.linalg.norm(mu, axis=-1), KEY_SHIFT * np.sqrt(128))
    np.testing.assert_allclose(s[1].mean(axis=(0, 1)), mu, atol=0.15)  # mean of 1024 N(0,1): +-0.031
    np.testing.assert_allclose(s[1] - g[1], np.broadcast_to(mu, g[1].shape), atol=1e-5)
    np.testing.assert_array_equal(s[0], g[0])
    np.testing.assert_array_equal(s[2], g[2])
    # softmax ignores the common key mean (up to k + mu's float32 rounding)
    gs = tuple(x[:, :128] for x in g)
    ss = tuple(x[:, :128] for x in s)
    assert emu.rel_l2(reference_attention(*ss), reference_attention(*gs)) < 1e-5


def test_e4m3_rounding():
    x = np.array([0.0, 1.0, 1.0625, 500.0, -500.0, 3e-3])
    y = emu.e4m3(x)
    assert y[0] == 0 and y[1] == 1 and y[3] == 448 and y[4] == -448   # saturating, not NaN
    np.testing.assert_array_equal(y, x.clip(-448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64))
    np.testing.assert_allclose(emu.e4m3(x[5:], 448 / 3e-3), x[5:], rtol=2 ** -4)


@pytest.mark.parametrize("causal", [False, True])
def test_no_quantization_is_float64_reference(causal):
    q, k, v = make_qkv("gaussian", 1, 128, 128, 4, 2, 128, "float32", 0)      # GQA too
    ref = reference_attention(q, k, v, is_causal=causal)
    np.testing.assert_allclose(emu.fp8_attention(q, k, v, is_causal=causal, quantize=()), ref, rtol=0, atol=1e-13)


@pytest.mark.parametrize("dist", ["outliers", "channel-outliers"])
@pytest.mark.parametrize("recipe", ["hadamard", "smooth-k", "had+smooth+block"])
def test_rotation_and_smoothing_are_exact_in_float64(dist, recipe):
    q, k, v = make_qkv(dist, 1, 128, 128, 2, 2, 128, "float32", 0)
    for causal in (False, True):
        ref = reference_attention(q, k, v, is_causal=causal)
        out = emu.fp8_attention(q, k, v, is_causal=causal, quantize=(), recipe=recipe)
        assert emu.rel_l2(out, ref) < 1e-12


def test_hadamard_is_orthonormal():
    R = emu.random_hadamard(128, 0)
    np.testing.assert_allclose(R @ R.T, np.eye(128), atol=1e-14)
    assert not np.array_equal(R, emu.random_hadamard(128, 1))


def test_block_scale_shape():
    x = np.random.default_rng(0).standard_normal((1, 200, 3, 16))
    x[0, 70, 1, 5] = 100.0
    s = emu.scale_for(x, "block")
    assert s.shape == (1, 200, 3, 1)
    assert s[0, 64, 1, 0] == s[0, 127, 1, 0] == 448 / 100.0 and s[0, 0, 1, 0] > 448 / 100.0
    assert np.all(np.abs(x * s) <= 448 + 1e-9)


def test_all_quantized_gaussian_error_is_a_few_percent():
    q, k, v = make_qkv("gaussian", 1, 256, 256, 2, 2, 128, "float32", 0)
    ref = reference_attention(q, k, v)
    bf16 = emu.rel_l2(reference_attention(q, k, v, emulate="bfloat16"), ref)
    for recipe in ("amax", "block64"):
        err = emu.rel_l2(emu.fp8_attention(q, k, v, quantize="all", recipe=recipe), ref)
        assert 0.01 < err < 0.10, (recipe, err)
        assert err > 5 * bf16
        only_o = emu.rel_l2(emu.fp8_attention(q, k, v, quantize=("O",), recipe=recipe), ref)
        assert 0.01 < only_o < err                   # e4m3 output alone: ~2-3% rms


def test_the_emulation_is_numpy_only():
    code = "import sys, attnlab.reference.fp8_emulation; assert 'jax' not in sys.modules, 'jax imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_table_has_one_section_per_length_and_mask():
    rows = [dict(T=T, causal=c, dist="gaussian", recipe=rc, quantized=col, rel_l2=0.02)
            for T in (128, 256) for c in (False, True) for rc in ("bf16-emulation", "amax")
            for col in emu.COLUMNS]
    text = emu.table(rows)
    assert text.count("### T = S =") == 4 and "### T = S = 256, causal" in text
    assert "| amax | gaussian | 2.000 |" in text and "| 1.00x | 1.00x |" in text
