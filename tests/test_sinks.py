"""Attention sinks (gpt-oss: one learned logit per query head in the softmax denominator, with no value):
naive and xla against the float64 reference, forward, residual and gradients (d sinks included);
decode and serving through their generic paths; every other backend but attnlab-decode (its kernels:
tests/test_sinks_kernels.py) refuses, saying why."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
import attnlab.reference.inputs
from attnlab import backends
from attnlab.core.prepare import AttentionSpec
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.float64 import check_close, reference_attention_grads
from attnlab.reference.serving64 import reference_serving_attention

N, K, H = 4, 2, 16
SINKS = jnp.array([0.5, -1.0, 2.0, 1.0], jnp.float32)


def _inputs(dtype="float32", B=2, T=8, S=8, seed=3):
    return attnlab.reference.inputs.random_qkv(B, T, S, N, K, H, dtype, seed=seed)


#: GQA (N=4, K=2), causal, a window, a bias, query and key lengths; batch 1 sees no key at all
CASE = dict(is_causal=True, local_window_size=(3, 0), query_seq_lengths=[8, 6],
            key_value_seq_lengths=jnp.array([7, 0], jnp.int32),
            bias=jnp.linspace(-1.0, 1.0, 64, dtype=jnp.float32).reshape(1, 1, 8, 8))


@pytest.mark.parametrize("impl", ["naive", "xla"])
def test_paths_match_float64_with_residual_and_grads(impl):
    q, k, v = _inputs()
    kw = CASE
    fn = jax.jit(lambda q, k, v, s: attnlab.attention(q, k, v, implementation=impl, sinks=s, return_residual=True,
                                                      **kw))
    out, lse = fn(q, k, v, SINKS)
    assert check_close((out, lse), q, k, v, sinks=SINKS, return_residual=True, **kw).ok
    assert not check_close(out, q, k, v, **kw).ok, "the sink changes the result"
    # a row that sees no key puts all its weight on the sink: 0, lse = sink; padded rows (t >= 6) give 0
    assert not np.any(np.asarray(out[1])) and np.allclose(lse[1, :6], SINKS[None, :])
    ct = jax.random.normal(jax.random.PRNGKey(5), q.shape)
    grads = jax.grad(lambda *a: jnp.sum(fn(*a)[0] * ct), argnums=(0, 1, 2, 3))(q, k, v, SINKS)
    ref = reference_attention_grads(q, k, v, ct, sinks=SINKS, **kw)
    assert len(ref) == 4 and np.abs(ref[3]).min() > 1e-3     # d sinks is not trivially 0
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(np.asarray(g), r, rtol=2e-4, atol=2e-4)


def test_bfloat16_and_minus_inf_sinks():
    q, k, v = _inputs("bfloat16")
    kw = dict(is_causal=True, implementation="xla")
    out = attnlab.attention(q, k, v, sinks=SINKS, **kw)
    assert check_close(out, q, k, v, sinks=SINKS, is_causal=True).ok
    none = attnlab.attention(q, k, v, sinks=jnp.full((N,), -jnp.inf, jnp.float32), **kw)
    np.testing.assert_array_equal(np.asarray(none, np.float32), np.asarray(attnlab.attention(q, k, v, **kw), np.float32))


def test_every_other_backend_refuses_sinks_saying_why(monkeypatch):
    spec = AttentionSpec(1, 64, 64, N, K, 64, "bfloat16", has_sinks=True)
    refusing = [b for b in backends.all_backends() if b.name not in ("naive", "xla", "attnlab-decode")]
    for b in refusing:      # as on a GPU with every library: the sinks rule speaks before any other
        monkeypatch.setattr(b, "available", lambda: None)
        assert b.why_not(spec).startswith("sinks:") and not b.takes_sinks, b.name
    assert "cuDNN" in backends.get("cudnn").why_not(spec)
    q, k, v = _inputs()
    e = attnlab.explain(q, k, v, sinks=SINKS)
    assert e.chosen == "xla" and e.reasons["naive"] is None and e.reasons["attnlab-decode"] is None
    assert backends.get("attnlab-decode").takes_sinks
    L = jnp.array([8, 5], jnp.int32)
    d = attnlab.explain_decode(q[:, :2], k, v, L, sinks=SINKS)
    assert d.reasons["attnlab-decode"] is None and d.reasons["xla"] is None
    s = attnlab.explain_serving(q[0], k, v, jnp.array([0, 3, 5]), L, sinks=SINKS)
    assert s.reasons["attnlab-decode"] is None and s.chosen == "xla"


def test_decode_masked_path_matches_float64():
    q, k, v = _inputs(T=3, S=9)
    L = jnp.array([9, 5], jnp.int32)
    out = attnlab.decode_attention(q, k, v, L, implementation="xla", sinks=SINKS)   # the masked path
    assert check_decode_close(out, q, k, v, L, sinks=SINKS).ok
    assert not check_decode_close(out, q, k, v, L).ok


def test_serving_xla_path_matches_float64():
    q, k, v = _inputs(B=2, T=6, S=9)
    q = q[0]                                        # (T_total=6, N, H): requests of 3 and 2 tokens, 1 padding
    starts, L = jnp.array([0, 3, 5]), jnp.array([7, 4])
    out = attnlab.serving_attention(q, k, v, starts, L, implementation="xla", sinks=SINKS)
    ref = reference_serving_attention(q, k, v, starts, L, sinks=SINKS)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)
    assert np.abs(ref - reference_serving_attention(q, k, v, starts, L)).max() > 1e-2


@pytest.mark.parametrize("bad,err,words", [
    (jnp.zeros((2,), jnp.float32), ValueError, r"sinks must have shape \(N,\)=\(4,\)"),
    (jnp.zeros((1, 4), jnp.float32), ValueError, r"sinks must have shape \(N,\)"),
    (jnp.zeros((4,), jnp.int32), TypeError, "sinks must have a floating dtype"),
    ([0.0] * 4, TypeError, "sinks must be an array"),
    (jnp.array([0.0, jnp.nan, 0.0, 0.0]), ValueError, r"sinks must be finite logits \(or -inf: no sink\), got nan at head 1"),
    (jnp.array([0.0, 0.0, 0.0, jnp.inf]), ValueError, "got inf at head 3"),
])
def test_bad_sinks_raise_named_errors(bad, err, words):
    q, k, v = _inputs()
    L = jnp.array([8, 5], jnp.int32)
    for call in (lambda: attnlab.attention(q, k, v, sinks=bad),
                 lambda: attnlab.decode_attention(q[:, :2], k, v, L, sinks=bad),
                 lambda: attnlab.serving_attention(q[0], k, v, jnp.array([0, 3, 5]), L, sinks=bad)):
        with pytest.raises(err, match=words):
            call()


def test_a_minus_infinite_sink_is_no_sink():
    q, k, v = _inputs()
    none = jnp.full((4,), -jnp.inf, jnp.float32)
    np.testing.assert_allclose(np.asarray(attnlab.attention(q, k, v, sinks=none)),
                               np.asarray(attnlab.attention(q, k, v)), rtol=1e-6, atol=1e-6)


def test_with_no_keys_at_all_the_lse_is_the_sink_as_when_every_key_is_hidden():
    """S = 0 (an empty call, no backend): each kept row's lse is its head's sink, padded rows' -inf; the same as
    S >= 1 with every key hidden, eager and under jit, in the float64 reference too."""
    q, k, v = _inputs()
    lengths = jnp.array([8, 5], jnp.int32)
    kw = dict(sinks=SINKS, return_residual=True, query_seq_lengths=lengths)
    hidden = attnlab.attention(q, k, v, key_value_seq_lengths=jnp.array([0, 0], jnp.int32), **kw)[1]
    for lse in (attnlab.attention(q, k[:, :0], v[:, :0], **kw)[1],
                jax.jit(lambda q, k, v: attnlab.attention(q, k, v, **kw)[1])(q, k[:, :0], v[:, :0]),
                attnlab.reference_attention(q, k[:, :0], v[:, :0], **kw)[1]):
        np.testing.assert_array_equal(np.asarray(lse)[1, :5], np.broadcast_to(SINKS, (5, N)))
        np.testing.assert_array_equal(np.asarray(lse)[1, 5:], -np.inf)
        np.testing.assert_array_equal(np.asarray(lse)[0], np.asarray(hidden)[0])
    out = jnp.zeros_like(q)
    assert check_close((out, attnlab.attention(q, k[:, :0], v[:, :0], **kw)[1]), q, k[:, :0], v[:, :0], **kw).ok
    assert not check_close((out, jnp.full((2, 8, N), -jnp.inf)), q, k[:, :0], v[:, :0], **kw).ok


def test_sweep_cells_carry_sinks_to_the_call_and_both_references(monkeypatch):
    """--sinks both: a cell without and one with; the call gets ``random_sinks(N)`` and so do the float32 and
    float64 references: a call given other sinks than the references' is incorrect."""
    from attnlab.measure import Options
    from attnlab.measure import inputs as measure_inputs
    from attnlab.measure.cell import measure_cell
    from attnlab.reference.inputs import random_sinks
    from attnlab.sweep.spec import SweepError, build

    sweep = build({"backends": "xla", "batch": "2", "q_len": "2", "kv_len": "32", "heads": "4", "kv_heads": "2",
                   "head_dim": "16", "dtype": "float32", "causal": "true", "lengths": "ragged", "sinks": "both"})
    plain, cell = sweep.cells()
    assert (plain.sinks, cell.sinks) == (False, True) and cell.config_label.endswith(" sinks")
    assert plain.key() != cell.key() and "sinks" not in plain.config_label
    np.testing.assert_array_equal(random_sinks(4), random_sinks(4))
    opts = Options(repeats=1, warmup=0, min_time_s=0)
    rec = measure_cell(cell, opts)
    assert rec["status"] == "ok" and rec["sinks"] is True, rec["reason"]
    # the emulation (with sinks) agrees with the float64 rows: they too have the sinks (else the baseline hides it)
    assert rec["checks"]["float64_rows"]["baseline"] < 1e-5
    monkeypatch.setattr(measure_inputs, "random_sinks", lambda n: random_sinks(n) + 3.0)   # the call's only
    rec = measure_cell(cell, opts)
    assert rec["status"] == "incorrect" and "float32" in rec["reason"] and "float64" in rec["reason"], rec["reason"]
    with pytest.raises(SweepError, match="sinks: 'maybe' must be true, false or both"):
        build({"backends": "xla", "sinks": "maybe"})
