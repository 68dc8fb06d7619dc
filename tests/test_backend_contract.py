"""One backend contract: every hook a caller uses is declared on ``Backend`` with a default, and no
caller discovers hooks with getattr/hasattr (issue 24)."""
from __future__ import annotations

import pathlib
import re

import jax.numpy as jnp
import numpy as np
import pytest

from attnlab import backends
from attnlab.api.decode import prepare_decode
from attnlab.backends.base import Backend
from attnlab.core.errors import UnsupportedError
from attnlab.core.prepare import prepare
from attnlab.reference.decode64 import reference_decode_attention

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "attnlab"
# getattr/hasattr on a backend object (``backend``, ``b``, ``own``): a hook the contract does not declare
DISCOVERY = re.compile(r"\b(getattr|hasattr)\(\s*(backend|b|own)\s*,")


def test_no_backend_hook_is_discovered_with_getattr():
    hits = [f"{path.relative_to(SRC)}:{n}: {line.strip()}"
            for path in sorted(SRC.rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if DISCOVERY.search(line)]
    assert hits == []


class _Minimal(Backend):
    """A backend that declares nothing but ``run`` (the naive backend's computation)."""
    name = "minimal"

    def run(self, p):
        return backends.get("naive").run(p)


def test_a_minimal_backend_gets_the_declared_defaults():
    b = _Minimal()
    assert (b.native, b.fp8, b.decode, b.paged, b.rel_l2_limit, b.compute_dtype) == (False, False, False, False, None, None)
    spec = prepare(jnp.zeros((1, 4, 2, 8)), jnp.zeros((1, 16, 2, 8)), jnp.zeros((1, 16, 2, 8))).spec
    assert b.auto_claim(spec) is not None          # claims nothing: the static rule never picks it unasked


def test_default_run_decode_is_masked_attention_and_matches_float64():
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((2, 3, 4, 16)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((2, 20, 2, 16)), jnp.float32) for _ in range(2))
    lengths = jnp.asarray([7, 20], jnp.int32)
    d = prepare_decode(q, k, v, lengths, causal=True)
    out = np.asarray(_Minimal().run_decode(d))
    ref = reference_decode_attention(q, k, v, lengths, causal=True)
    assert out.shape == (2, 3, 4, 16)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    assert _Minimal().supports_decode(d.spec) is None


def test_default_paged_decode_refuses_with_the_backend_name():
    with pytest.raises(UnsupportedError, match="minimal.*no paged KV cache path"):
        _Minimal().run_paged_decode(None, None)


class _ForwardClaimer(Backend):
    """Claims every input it runs, forward only, and has no decode path: auto must see all three."""
    name = "forward-claimer"
    forward_only = True

    def supports_decode(self, spec):
        return "no decode path in this backend"

    def auto_claim(self, spec):
        return self.why_not(spec)

    def run(self, p):
        return backends.get("naive").run(p)


def test_auto_honours_a_claim_only_where_the_claimer_runs_the_call():
    """decode_attention's auto never runs a backend that refuses the decode call, and attention's auto under a
    gradient never runs a forward-only claimer: each explain names the backend that ran, whose reason is None."""
    import jax

    import attnlab

    q, k = jnp.ones((1, 2, 2, 16)), jnp.ones((1, 8, 2, 16))
    with backends.registered(_ForwardClaimer()):
        assert attnlab.explain(q, k, k).chosen == "forward-claimer"            # forward: its claim stands
        ex = attnlab.explain_decode(q, k, k, jnp.array([5]))
        assert ex.chosen != "forward-claimer" and ex.reasons[ex.chosen] is None
        np.testing.assert_allclose(np.asarray(attnlab.decode_attention(q, k, k, jnp.array([5]))),
                                   reference_decode_attention(q, k, k, [5]), rtol=2e-5, atol=2e-5)
        assert attnlab.explain(q, k, k, mode="train").chosen != "forward-claimer"
        g = jax.grad(lambda x: attnlab.attention(x, k, k).sum())(q)
        assert np.all(np.isfinite(np.asarray(g)))


def test_a_serving_backend_that_takes_no_scales_refuses_a_quantized_cache():
    """``takes_kv_scales`` is applied to serving calls as to decode ones: a backend whose ``supports_serving`` says
    yes but that declares no quantized cache refuses one (it would read the int8 codes as values)."""
    import attnlab
    from attnlab.backends.masked_serving import masked_serving

    class Plain(Backend):
        name = "plain-serving"

        def supports_serving(self, spec):
            return None

        def run_serving(self, call):
            return masked_serving(call.q, call.key, call.value, call.q_starts, call.kv_lengths, scale=call.scale)

    q, k = jnp.ones((3, 2, 16)), jnp.ones((2, 8, 1, 16))
    kq, ks = attnlab.quantize_kv_cache(k, "int8", "token")
    args = (q, kq, kq, jnp.array([0, 1, 3]), jnp.array([4, 8]))
    with backends.registered(Plain()):
        assert "k_scale" in attnlab.explain_serving(*args, k_scale=ks, v_scale=ks).reasons["plain-serving"]
        with pytest.raises(UnsupportedError, match="plain-serving"):
            attnlab.serving_attention(*args, k_scale=ks, v_scale=ks, implementation="plain-serving")
        assert attnlab.serving_attention(q, k, k, *args[3:], implementation="plain-serving").shape == q.shape
