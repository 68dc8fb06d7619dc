"""logits_soft_cap and packed segment ids: validation, every CPU path against the float64 reference
(gradients included), the device reference, decode_attention, and the cuDNN packed layout."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
import attnlab.reference.inputs
from attnlab.core import segments
from attnlab.backends import cudnn_packed
from attnlab.reference.float64 import check_close, reference_attention, reference_attention_grads
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.blockwise import blockwise_attention, blockwise_grads

CAP = 2.0


def _inputs(dtype="float32", B=2, T=24, N=4, K=2, H=8, seed=1):
    q, k, v = attnlab.reference.inputs.random_qkv(B, T, T, N, K, H, dtype, seed=seed)
    return q * 4, k, v        # large logits: the cap bites (|logits| up to ~10 > CAP)


def _ids(B=2, T=24):
    ids = segments.docs(B, T, 3, seed=0)
    ids[1, -5:] = -1           # a padded tail
    return jnp.asarray(ids)


CASES = {
    "cap": lambda ids: dict(logits_soft_cap=CAP),
    "cap+causal+window": lambda ids: dict(logits_soft_cap=CAP, is_causal=True, local_window_size=(5, 0)),
    "packed": lambda ids: dict(query_segment_ids=ids, key_value_segment_ids=ids),
    "packed+causal+lengths": lambda ids: dict(query_segment_ids=ids, key_value_segment_ids=ids, is_causal=True,
                                              key_value_seq_lengths=jnp.array([20, 24], jnp.int32)),
    "packed+cap+window": lambda ids: dict(query_segment_ids=ids, key_value_segment_ids=ids, logits_soft_cap=CAP,
                                          is_causal=True, local_window_size=(4, 0)),
}


def _can(impl, kw):
    return not (impl == "xla" and "logits_soft_cap" in kw)


@pytest.mark.parametrize("impl", ["naive", "xla", "tokamax-xla", None])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_paths_match_float64_reference_with_grads(impl, case, dtype):
    if impl and impl.startswith("tokamax"):
        pytest.importorskip("tokamax")
    q, k, v = _inputs(dtype)
    kw = CASES[case](_ids())
    if not _can(impl, kw):
        with pytest.raises(attnlab.UnsupportedError, match="xla: logits_soft_cap"):
            attnlab.attention(q, k, v, implementation=impl, **kw)
        return
    fn = jax.jit(lambda q, k, v: attnlab.attention(q, k, v, implementation=impl, **kw))
    out = fn(q, k, v)
    assert check_close(out, q, k, v, **kw).ok
    if "query_segment_ids" in kw:
        assert not np.any(np.asarray(out[1, -5:], np.float32)), "padding rows give 0"
    if dtype == "float32":
        ct = jax.random.normal(jax.random.PRNGKey(5), q.shape)
        grads = jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) * ct), argnums=(0, 1, 2))(q, k, v)
        for g, r in zip(grads, reference_attention_grads(q, k, v, ct, **kw)):
            np.testing.assert_allclose(np.asarray(g), r, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("impl", ["naive", "tokamax-xla"])
def test_numpy_inputs_run_as_jax_arrays_do(impl):
    """NumPy arrays (as jax.nn takes them): tokamax's own type checks refused them inside tokamax."""
    if impl.startswith("tokamax"):
        pytest.importorskip("tokamax")
    q, k, v = (np.asarray(x) for x in _inputs())
    kw = {n: np.asarray(x) if hasattr(x, "shape") else x for n, x in CASES["packed+cap+window"](_ids()).items()}
    assert check_close(attnlab.attention(q, k, v, implementation=impl, **kw), q, k, v, **kw).ok


def test_soft_cap_changes_the_result_and_bounds_logits():
    q, k, v = _inputs()
    capped, plain = (reference_attention(q, k, v, logits_soft_cap=c) for c in (CAP, None))
    assert np.abs(capped - plain).max() > 1e-2
    # a tiny cap flattens every logit to ~0: uniform attention, the mean of the values
    flat = reference_attention(q, k, v, logits_soft_cap=1e-6)
    mean = np.repeat(np.asarray(v, np.float64).mean(axis=1, keepdims=True), 2, axis=2)
    np.testing.assert_allclose(flat, np.broadcast_to(mean, flat.shape), atol=1e-6)


@pytest.mark.parametrize("case", list(CASES))
def test_device_reference_matches_float64(case):
    q, k, v = _inputs()
    ids = _ids()
    kw = CASES[case](ids)
    dkw = dict(causal=kw.get("is_causal", False), window=kw.get("local_window_size"), soft_cap=kw.get("logits_soft_cap"),
               q_segments=kw.get("query_segment_ids"), kv_segments=kw.get("key_value_segment_ids"),
               kv_lengths=kw.get("key_value_seq_lengths"), tile=8)
    np.testing.assert_allclose(np.asarray(blockwise_attention(q, k, v, **dkw)), reference_attention(q, k, v, **kw),
                               atol=2e-6)
    ct = jax.random.normal(jax.random.PRNGKey(2), q.shape)
    for g, r in zip(blockwise_grads(q, k, v, ct, **dkw), reference_attention_grads(q, k, v, ct, **kw)):
        np.testing.assert_allclose(np.asarray(g), r, atol=2e-5)


def test_segments_are_another_documents_wall():
    """Packing two documents in one row equals running each alone."""
    q, k, v = _inputs(B=1, T=16)
    ids = jnp.asarray([[0] * 6 + [1] * 10])
    out = attnlab.attention(q, k, v, is_causal=True, query_segment_ids=ids, key_value_segment_ids=ids)
    first = attnlab.attention(q[:, :6], k[:, :6], v[:, :6], is_causal=True)
    second = attnlab.attention(q[:, 6:], k[:, 6:], v[:, 6:], is_causal=True)
    np.testing.assert_allclose(np.asarray(out), np.concatenate([first, second], axis=1), atol=1e-6)


@pytest.mark.parametrize("T", [1, 4])
def test_decode_attention_soft_cap_kernel_and_generic(T):
    q, k, v = attnlab.reference.inputs.random_qkv(2, T, 40, 4, 2, 16, "float32", seed=3)
    q = q * 4
    lengths = jnp.array([40, 17])
    for impl in ("attnlab-decode", "naive"):
        out = attnlab.decode_attention(q, k, v, lengths, implementation=impl, logits_soft_cap=CAP)
        assert check_decode_close(out, q, k, v, lengths, logits_soft_cap=CAP).ok, impl
        assert not check_decode_close(out, q, k, v, lengths).ok, impl   # the cap did something


@pytest.mark.parametrize("bad,err,match", [
    (0.0, ValueError, "logits_soft_cap must be positive and finite"),
    (float("inf"), ValueError, "logits_soft_cap must be positive and finite"),
    (True, TypeError, "logits_soft_cap must be None or a positive finite float"),
    ("50", TypeError, "logits_soft_cap must be None or a positive finite float"),
])
def test_soft_cap_validated(bad, err, match):
    q, k, v = _inputs()
    with pytest.raises(err, match=match):
        attnlab.attention(q, k, v, logits_soft_cap=bad)
    with pytest.raises(err, match=match):
        attnlab.decode_attention(q, k, v, jnp.array([24, 24]), logits_soft_cap=bad)


def test_segment_ids_validated():
    q, k, v = _inputs()
    ids = _ids()
    with pytest.raises(ValueError, match="query_segment_ids needs its partner"):
        attnlab.attention(q, k, v, query_segment_ids=ids)
    with pytest.raises(ValueError, match=r"key_value_segment_ids must have shape \(B, S\)=\(2, 24\), got \(2, 23\)"):
        attnlab.attention(q, k, v, query_segment_ids=ids, key_value_segment_ids=ids[:, :-1])
    with pytest.raises(TypeError, match="query_segment_ids must be an integer array"):
        attnlab.attention(q, k, v, query_segment_ids=ids.astype(jnp.float32), key_value_segment_ids=ids)


def test_refusals_name_the_reason():
    q, k, v = _inputs()
    ids = _ids()
    e = attnlab.explain(q, k, v, logits_soft_cap=CAP, query_segment_ids=ids, key_value_segment_ids=ids)
    assert e.reasons["naive"] is None and e.chosen == "naive"
    assert e.reasons["xla"].startswith("logits_soft_cap: jax.nn")
    assert "logits_soft_cap" in e.reasons["attnlab-decode"] or "segment" in e.reasons["attnlab-decode"]
    e = attnlab.explain(q, k, v, query_segment_ids=ids, key_value_segment_ids=ids)
    assert e.reasons["xla"] is None
    assert "packed segments" in e.reasons["attnlab-decode"]


def test_cudnn_packed_layout_and_refusals():
    ids = jnp.asarray([[0, 0, 0, 1, 1, 2, -1, -1], [5, 5, 5, 5, 5, 5, 5, 5]])
    off, lens, start_ids, count = cudnn_packed.layout(ids, 4)
    assert off.tolist() == [[0, 3, 5, -1, -1], [0, -1, -1, -1, -1]]
    assert lens.tolist() == [[3, 2, 1, -1], [8, -1, -1, -1]]
    assert start_ids.tolist() == [[0, 1, 2, -1], [5, -1, -1, -1]] and count.tolist() == [3, 1]
    assert segments.host_layout(ids) == (3, True)
    assert segments.host_layout(jnp.asarray([[0, 1, 0]])) == (3, False)
    spec = lambda **kw: attnlab.explain(*_inputs(T=8, K=kw.pop("K", 4)), **kw).spec  # noqa: E731
    bad = jnp.asarray([[0, 1, 1, 0, 2, 2, 2, 2]] * 2)
    assert "not contiguous" in cudnn_packed.refusal(spec(query_segment_ids=bad, key_value_segment_ids=bad))
    assert "GQA" in cudnn_packed.refusal(spec(K=2, query_segment_ids=ids, key_value_segment_ids=ids))
    assert cudnn_packed.refusal(spec(query_segment_ids=ids, key_value_segment_ids=ids, is_causal=True)) is None
    # what run() refuses of concrete ids, explain and auto see first; lengths beside ids are refused (cut one side)
    other = jnp.asarray([[0, 0, 0, 2, 2, 1, -1, -1], [5] * 8])
    assert "differ" in cudnn_packed.refusal(spec(query_segment_ids=ids, key_value_segment_ids=other))
    assert "query_seq_lengths" in cudnn_packed.refusal(spec(query_segment_ids=ids, key_value_segment_ids=ids,
                                                            query_seq_lengths=jnp.asarray([8, 4])))
    with pytest.raises(attnlab.UnsupportedError, match="differ"):
        cudnn_packed.check_concrete(ids, jnp.asarray([[1, 1, 1, 0, 0, 2, 2, 2], [5] * 8]), aligned=False)


def test_docs_packing_is_seeded_contiguous_and_parsed():
    a, b = segments.docs(3, 64, 4, seed=7), segments.docs(3, 64, 4, seed=7)
    assert np.array_equal(a, b) and a.shape == (3, 64)
    assert all(sorted(set(r.tolist())) == [0, 1, 2, 3] for r in a) and segments.host_layout(a) == (4, True)
    assert segments.parse_packing("docs:4") == 4 and segments.parse_packing("none") is None
    with pytest.raises(ValueError, match="packing: 'docs:x' must be none or docs:N"):
        segments.parse_packing("docs:x")


# --- sweeps: the cell's check applies the cap and the segment masks ---------------------------

class _Blind(attnlab.backends.Backend):
    """Claims to take the cap and segments, but runs plain attention: the check must catch it."""
    takes_soft_cap = takes_segment_ids = True

    def __init__(self, name):
        self.name = name

    def run(self, p):
        import dataclasses

        from attnlab.backends.naive import NaiveBackend

        plain = dataclasses.replace(p, q_segment_ids=None, kv_segment_ids=None, soft_cap=None, has_segment_ids=False)
        return NaiveBackend().run(plain)


@pytest.mark.parametrize("field,value", [("packing", "docs:4"), ("soft_cap", 1.0)])
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_cell_check_catches_a_backend_that_ignores_cap_or_segments(field, value, mode):
    from attnlab import backends
    from attnlab.measure.cell import Cell, Options, measure_cell

    name = f"blind-{field}"
    backends.register(_Blind(name))
    try:
        opts = Options(repeats=1, warmup=0, min_time_s=0.0, max_input_sets=1)
        kw = {field: value}
        good = measure_cell(Cell("naive", 1, 64, 64, 2, 2, 16, "float32", True, mode=mode, **kw), opts)
        assert good["status"] == "ok" and good[field] == value, good["reason"]
        bad = measure_cell(Cell(name, 1, 64, 64, 2, 2, 16, "float32", True, mode=mode, **kw), opts)
        assert bad["status"] == "incorrect", bad
    finally:
        backends._REGISTRY.pop(name, None)


def test_sweep_flags_make_cap_and_packing_cells():
    from attnlab.sweep import SweepError, build

    s = build({"backends": "naive", "seq": "64", "soft_cap": "none,50", "packing": "none,docs:4"})
    cells = s.cells()
    assert sorted((c.soft_cap or 0, c.packing or "") for c in cells) == [(0, ""), (0, "docs:4"), (50.0, ""), (50.0, "docs:4")]
    assert "cap=50 packing=docs:4" in cells[-1].config_label
    with pytest.raises(SweepError, match="soft_cap: 'big' is not none or a positive number"):
        build({"backends": "naive", "seq": "64", "soft_cap": "big"})
    with pytest.raises(SweepError, match="packing: 'docs' must be none or docs:N"):
        build({"backends": "naive", "seq": "64", "packing": "docs"})


def test_peers_refuse_the_soft_cap_naming_themselves():
    from attnlab import backends
    from attnlab.core.prepare import AttentionSpec

    spec = AttentionSpec(1, 64, 64, 2, 2, 64, "bfloat16", soft_cap=50.0)
    for name, words in (("cudnn", "cuDNN"), ("te", "TransformerEngine"), ("torch-flash", "PyTorch"), ("xla", "jax.nn")):
        b = backends.get(name)
        assert words in b.soft_cap_reason and not b.takes_soft_cap
    assert backends.get("naive").why_not(spec) is None


def test_segment_ids_past_int32_are_refused_not_read_as_padding():
    """uint32 ids >= 2**31 wrapped negative in the masks' int32 compare: every row became padding."""
    q, k, v = _inputs(T=8)
    ids = np.array([[0x80000000] * 4 + [0x80000001] * 4] * q.shape[0], np.uint32)
    with pytest.raises(ValueError, match=r"query_segment_ids must lie in int32's range \[-2\*\*31, 2\*\*31\)"):
        attnlab.attention(q, k, v, query_segment_ids=ids, key_value_segment_ids=ids, implementation="naive")
    small = (ids - np.uint32(0x80000000)).astype(np.uint32)          # the same documents, ids 0 and 1: run
    assert bool(jnp.all(jnp.isfinite(attnlab.attention(q, k, v, query_segment_ids=small, key_value_segment_ids=small,
                                                       implementation="naive"))))


@pytest.mark.parametrize("kind", ["attention", "decode", "serving"])
def test_a_cap_of_50_that_a_path_drops_fails_the_cells_check(monkeypatch, kind):
    """N(0, 1) logits barely feel 50 tanh(x / 50): a path that dropped the cap passed. A soft-capped cell draws q
    times cap / 5 (reference.inputs.cap_reach), so the cap bends its logits and its check catches the path."""
    from attnlab import backends
    from attnlab.backends import xla
    from attnlab.measure.cell import Cell, Options, measure_cell

    opts = Options(repeats=1, warmup=0, min_time_s=0.0, max_input_sets=1, compile_ahead=False)
    cell = {"attention": Cell("blind-soft_cap", 1, 64, 64, 2, 2, 64, "bfloat16", True, soft_cap=50.0),
            "decode": Cell("blind-soft_cap", 2, 1, 256, 4, 2, 64, "bfloat16", True, lengths="ragged", soft_cap=50.0),
            "serving": Cell("xla", 3, 2, 128, 4, 2, 64, "bfloat16", True, lengths="one-long", soft_cap=50.0,
                            prefill_chunks="1x8")}[kind]
    good = measure_cell(dataclasses.replace(cell, backend="naive") if kind != "serving" else cell, opts)
    assert good["status"] == "ok" and "q x10" in good["inputs_draw"], good["reason"]
    real = xla.masked_serving
    monkeypatch.setattr(xla, "masked_serving", lambda *a, soft_cap=None, **k: real(*a, **k))
    backends.register(_Blind("blind-soft_cap"))
    try:
        # serving: another batch, as the good step's compiled function is kept for its shapes
        assert measure_cell(dataclasses.replace(cell, batch=4) if kind == "serving" else cell, opts)["status"] == \
            "incorrect"
    finally:
        backends._REGISTRY.pop("blind-soft_cap", None)
