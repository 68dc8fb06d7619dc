"""cuDNN with a mask at odd T or S (issue 25, item 5): JAX's cuDNN path accepts a forward-only call
(``check_is_flash_attention`` asks for even lengths only when training), so attnlab runs it and
refuses only a backward pass or return_residual (which runs JAX's training kernel), naming the rule."""
import jax
import jax.numpy as jnp
import pytest

import attnlab
from attnlab.api import dot_product as api
from attnlab import backends
from attnlab.api.decode import prepare_decode
from attnlab.core.errors import UnsupportedError


def _spec(T=3, S=64, mask=True, **kw):
    s = jax.ShapeDtypeStruct
    m = jnp.ones((1, 1, T, S), bool) if mask else None
    return attnlab.core.prepare.prepare(s((1, T, 4, 64), "bfloat16"), s((1, S, 2, 64), "bfloat16"), s((1, S, 2, 64), "bfloat16"),
                                mask=m, **kw).spec


@pytest.mark.parametrize("T, S", [(3, 64), (4, 63), (5, 33)])
def test_forward_with_a_mask_at_odd_lengths_is_supported_backward_refused(T, S):
    b = backends.get("cudnn")
    spec = _spec(T, S)
    assert b.supports(spec) is None and b.mode_reason(spec, "fwd") is None
    for mode in ("fwd+bwd", "bwd"):
        why = b.mode_reason(spec, mode)
        assert why.startswith("backward pass: a bias or mask needs even sequence lengths (T % 2 == 0 and S % 2 == 0)")
        assert f"T={T}, S={S}" in why
    assert "return_residual runs JAX's cuDNN training kernel" in b.supports(_spec(T, S, return_residual=True))


def test_even_lengths_or_no_mask_need_no_rule():
    b = backends.get("cudnn")
    assert b.mode_reason(_spec(4, 64), "fwd+bwd") is None
    assert b.mode_reason(_spec(3, 63, mask=False), "fwd+bwd") is None


def test_decode_at_odd_T_reaches_cudnn_and_a_gradient_is_refused_at_selection(monkeypatch):
    """decode_attention(implementation="cudnn") at T = 3 is the forward call with a mask: selected
    (it fails later on the CPU only because cuDNN needs a GPU). Under jax.grad attention() names
    the rule; auto's static rule still skips cuDNN there (it cannot see grad(jit(f)))."""
    q, k, v = (jnp.zeros(s, jnp.bfloat16) for s in ((1, 3, 4, 64), (1, 64, 2, 64), (1, 64, 2, 64)))
    d = prepare_decode(q, k, v, [64])
    b = backends.get("cudnn")
    monkeypatch.setattr(type(b), "available", lambda self: None)
    att = d.as_attention()
    assert api.select(att, "cudnn") is b
    with pytest.raises(UnsupportedError, match="cudnn: backward pass: a bias or mask needs even sequence lengths"):
        api.select(att, "cudnn", mode="train")
    assert api.static_rule(att)[0].name != "cudnn"
    assert api.static_rule(_spec(4, 64))[0].name == "cudnn"
