"""A verdict that cannot be fooled: a catalogue of wrong outputs, each refused; rows that see no key compared
by one rule (jax.nn's mean of V or 0), said in the verdict; the lse of ``return_residual=True`` checked.

The rules: ``attnlab.reference.rules``; in words: docs/measuring.md ("Tolerance policy").
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab.core.errors import OutputMismatchError
from attnlab.measure import check
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.float64 import check_close, reference_attention
from attnlab.reference.inputs import random_qkv

B, T, N, K, H = 2, 32, 4, 2, 8
# batch 1 sees keys < 6 only: its rows t >= 6 + 16 see no key (causal window of 16 back)
EMPTY = dict(is_causal=True, local_window_size=(16, 2), key_value_seq_lengths=jnp.asarray([T, 6]))
EMPTY_ROWS = T - 6 - 16


def _twin_batch():
    """Two identical batch elements, so that a wrong batch would broadcast onto the right one."""
    q, k, v = random_qkv(1, T, T, N, K, H, "float32", seed=3)
    return tuple(jnp.concatenate([x, x]) for x in (q, k, v))


@pytest.fixture(scope="module")
def twin():
    q, k, v = _twin_batch()
    return attnlab.attention(q, k, v, is_causal=True, return_residual=True), (q, k, v)


def _swap_heads(o):
    return o[:, :, [1, 0] + list(range(2, o.shape[2]))]


WRONG = {   # name -> (wrong output from (out, lse), return_residual)
    "wrong batch": (lambda o, l: o[:1], False),
    "wrong head dim": (lambda o, l: o[..., :H // 2], False),
    "transposed": (lambda o, l: o.transpose(0, 2, 1, 3), False),
    "wrong dtype": (lambda o, l: o.astype(jnp.bfloat16), False),
    "a tuple for an array": (lambda o, l: (o, l), False),
    "a list of one": (lambda o, l: [o], False),
    "an array for (out, lse)": (lambda o, l: o, True),
    "lse of the wrong shape": (lambda o, l: (o, l[:, :, 0]), True),
    "a zeroed row": (lambda o, l: o.at[1, 5].set(0.0), False),
    "swapped heads": (lambda o, l: _swap_heads(o), False),
    "NaN in one element": (lambda o, l: o.at[0, 3, 1, 2].set(jnp.nan), False),
    "one row 1% off": (lambda o, l: o.at[1, T - 1].multiply(1.01), False),
    "lse 1e-3 off": (lambda o, l: (o, l + 1e-3), True),
    "lse of swapped heads": (lambda o, l: (o, l[:, :, [1, 0, 2, 3]]), True),
    "lse without its scale": (lambda o, l: (o, l * np.sqrt(H)), True),
}


@pytest.mark.parametrize("name", WRONG)
def test_every_wrong_output_is_refused(twin, name):
    (out, lse), (q, k, v) = twin
    make, residual = WRONG[name]
    try:
        verdict = check_close(make(out, lse), q, k, v, is_causal=True, return_residual=residual)
    except OutputMismatchError as e:      # refused before measuring, naming the argument and the rule
        assert e.argument.startswith("out") and ("must" in e.rule), e
        return
    assert not verdict.ok, (name, verdict)


def test_the_right_output_passes_and_its_lse_is_checked(twin):
    (out, lse), (q, k, v) = twin
    verdict = check_close((out, lse), q, k, v, is_causal=True, return_residual=True)
    assert verdict.ok and verdict.lse_err < verdict.lse_limit and verdict.empty_rows == 0 and not verdict.note
    assert check_close(out, q, k, v, is_causal=True).lse_err is None


def test_shape_errors_name_the_argument_and_the_rule(twin):
    (out, _), (q, k, v) = twin
    with pytest.raises(OutputMismatchError, match=r"out: must have shape \(2, 32, 4, 8\).*got \(1, 32, 4, 8\)"):
        check_close(out[:1], q, k, v)
    with pytest.raises(OutputMismatchError, match="return_residual=True"):
        check_close((out, out), q, k, v)
    with pytest.raises(TypeError, match="^query must have a floating dtype .*got int32$"):   # not the output's rule
        check_close(out, q.astype(jnp.int32), k, v)
    with pytest.raises(TypeError, match="^check_close needs concrete arrays"):
        jax.jit(lambda out, q, k, v: check_close(out, q, k, v).ok)(out, q, k, v)
    with pytest.raises(TypeError, match="^check_close needs concrete arrays"):       # a traced (out, lse) pair
        jax.jit(lambda o, l: check_close((o, l), q, k, v, return_residual=True).ok)(out, out[..., 0])
    with pytest.raises(ValueError, match="rule= is the words of a given limit="):    # it was replaced without a word
        check_close(out, q, k, v, rule="mine")
    assert check_close(out, q, k, v, limit=1.0, rule="mine").rule == "mine"


@pytest.mark.parametrize("impl,how", [("xla", "compared as jax.nn's value"), ("naive", "compared as zeros")])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_that_see_no_key_pass_by_one_rule_and_are_counted(impl, how, dtype):
    q, k, v = random_qkv(B, T, T, N, K, H, dtype, seed=4)
    out, lse = attnlab.attention(q, k, v, implementation=impl, return_residual=True, **EMPTY)
    verdict = check_close((out, lse), q, k, v, return_residual=True, **EMPTY)
    assert verdict.ok, verdict
    assert verdict.empty_rows == EMPTY_ROWS and verdict.note == f"{EMPTY_ROWS} rows see no key: " + how + (
        " there (the mean of V over the keys its masks hide)" if impl == "xla" else "")


def test_the_bfloat16_verdict_does_not_need_numpys_finfo(monkeypatch):
    """Newer NumPy (the H200 image's) refuses bfloat16 in np.finfo; the rules take finfo from ml_dtypes."""
    finfo = np.finfo

    def numpy_without_bfloat16(dtype):
        if np.dtype(dtype).name == "bfloat16":
            raise ValueError("data type dtype(bfloat16) not compatible with finfo")
        return finfo(dtype)

    monkeypatch.setattr(np, "finfo", numpy_without_bfloat16)
    q, k, v = random_qkv(B, T, T, N, K, H, "bfloat16", seed=4)
    out = attnlab.attention(q, k, v, implementation="xla", return_residual=True, **EMPTY)
    assert check_close(out, q, k, v, return_residual=True, **EMPTY).ok

def test_the_reference_gives_jax_nns_value_where_a_row_sees_no_key():
    q, k, v = random_qkv(B, T, T, N, K, H, "float32", seed=4)
    ref, lse = reference_attention(q, k, v, return_residual=True, **EMPTY)
    mean_v = np.repeat(np.asarray(v, np.float64)[1].mean(axis=0), N // K, axis=0)     # over all S keys
    np.testing.assert_allclose(ref[1, T - 1], mean_v, rtol=1e-12)
    assert np.all(lse[1, T - EMPTY_ROWS:] == -np.inf) and np.all(np.isfinite(lse[1, :T - EMPTY_ROWS]))
    xla_out, xla_lse = attnlab.attention(q, k, v, implementation="xla", return_residual=True, **EMPTY)
    np.testing.assert_allclose(np.asarray(xla_out), ref, atol=1e-5)
    live = np.isfinite(lse)
    np.testing.assert_allclose(np.asarray(xla_lse)[live], lse[live], rtol=1e-5)


@pytest.mark.parametrize("wrong", ["garbage", "mean of the visible keys", "lse 0"])
def test_an_empty_row_holding_neither_value_fails(wrong):
    q, k, v = random_qkv(B, T, T, N, K, H, "float32", seed=4)
    out, lse = attnlab.attention(q, k, v, implementation="naive", return_residual=True, **EMPTY)
    if wrong == "garbage":
        out = out.at[1, T - 1].set(1.0)
    elif wrong == "mean of the visible keys":
        out = out.at[1, T - 1].set(jnp.repeat(v[1, :6].mean(axis=0), N // K, axis=0))
    else:
        lse = lse.at[1, T - 1].set(0.0)
    assert not check_close((out, lse), q, k, v, return_residual=True, **EMPTY).ok


def test_decode_check_refuses_wrong_shapes_and_tuples():
    q, k, v = random_qkv(2, 1, 16, N, K, H, "float32", seed=5)
    q = jnp.concatenate([q[:1], q[:1]])
    k, v = (jnp.concatenate([x[:1], x[:1]]) for x in (k, v))
    lengths = jnp.asarray([16, 16])
    out = attnlab.decode_attention(q, k, v, lengths)
    assert check_decode_close(out, q, k, v, lengths).ok
    for wrong in (out[:1], out.transpose(0, 2, 1, 3), (out, out), out.astype(jnp.bfloat16)):
        with pytest.raises(OutputMismatchError, match="^out"):
            check_decode_close(wrong, q, k, v, lengths)


def test_sweeps_apply_the_same_rule_to_empty_rows():
    """measure.check: the device reference (0 there) and the float64 rows (jax.nn's value) both accept
    either value, say how many rows saw no key, and still fail a wrong empty row."""
    q, k, v = random_qkv(B, T, T, N, K, H, "float32", seed=4)
    sem = check.Semantics(causal=True, window=(16, 2), kv_lengths=(T, 6))
    for impl in ("xla", "naive"):
        out = attnlab.attention(q, k, v, implementation=impl, **EMPTY)
        r = check.check_forward(out, q, k, v, sem, ref_key="empty-rows")
        assert r["ok"], r["reason"]
        assert r["checks"]["float32_device"]["empty_rows"] == EMPTY_ROWS == r["checks"]["float64_rows"]["empty_rows"]
        assert f"{EMPTY_ROWS} rows see no key" in r["tolerance"]
    r = check.check_forward(out.at[1, T - 1].set(1.0), q, k, v, sem, ref_key="empty-rows")
    assert not r["ok"] and not r["checks"]["float32_device"]["ok"] and not r["checks"]["float64_rows"]["ok"]


def test_sweep_gradients_accept_either_convention_in_empty_rows():
    """jax.nn's uniform softmax in a row that sees no key gives dv a share of that row's cotangent; naive's 0
    gives none: the gradient check accepts either, and still fails a dv 1% off."""
    import jax

    q, k, v = random_qkv(B, T, T, N, K, H, "float32", seed=4)
    ct = jax.random.normal(jax.random.key(1), q.shape, q.dtype)
    sem = check.Semantics(causal=True, window=(16, 2), kv_lengths=(T, 6))
    for impl in ("xla", "naive"):
        _, vjp = jax.vjp(lambda a, b, c: attnlab.attention(a, b, c, implementation=impl, **EMPTY), q, k, v)
        dq, dk, dv = vjp(ct)
        assert check.check_grads((dq, dk, dv), q, k, v, ct, sem, ref_key="empty-grads")["grad_check"] == "ok", impl
    assert check.check_grads((dq, dk, dv * 1.01), q, k, v, ct, sem, ref_key="empty-grads")["grad_check"] == "incorrect"
    with pytest.raises(OutputMismatchError, match="^dk: must have shape"):
        check.check_grads((dq, dk[:1], dv), q, k, v, ct, sem, ref_key="empty-grads")


def test_a_minus_inf_bias_row_is_judged_as_jax_nn_computes_it():
    """A -inf bias that hides a row's only causal key: jax.nn (xla) attends the keys its causal mask hides (their
    one finite masked logit), naive gives 0: both pass. A -inf bias on every key: jax.nn's NaN never passes, naive's
    0 does. A bias of finfo.min on the only visible key loses to jax.nn's masked value: xla is wrong there, naive
    and the reference attend that key."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 2, 1, 4), (1, 4, 1, 4), (1, 4, 1, 4)))
    hidden, every, low = (np.zeros((1, 1, 2, 4), np.float32) for _ in range(3))
    hidden[0, 0, 0, :], hidden[0, 0, 1, 2:] = -np.inf, -np.inf
    every[0, 0, 0, :] = -np.inf
    low[0, 0, 0, 0] = np.finfo(np.float32).min
    want = {"hidden": (True, True), "every": (False, True), "low": (False, True)}      # (xla ok, naive ok)
    for name, bias in (("hidden", hidden), ("every", every), ("low", low)):
        causal = name != "every"
        got = tuple(check_close(attnlab.attention(q, k, v, bias=bias, is_causal=causal, implementation=impl), q, k, v,
                                bias=bias, is_causal=causal).ok for impl in ("xla", "naive"))
        assert got == want[name], name
    ref = attnlab.reference_attention(q, k, v, bias=hidden, is_causal=True)
    assert np.allclose(np.asarray(ref)[0, 0, 0], v[0, 1:, 0].mean(axis=0))              # the causally hidden keys
    assert np.allclose(np.asarray(attnlab.reference_attention(q, k, v, bias=low, is_causal=True))[0, 0, 0], v[0, 0, 0])


@pytest.mark.parametrize("bug", ["window sides swapped", "default scale 1/H"])
def test_a_wrong_reading_of_the_arguments_in_the_paths_fails_check_close(monkeypatch, bug):
    """prepare (the paths' reading of the arguments) reads the window's sides the wrong way round, or the default
    scale as 1/H: check_close reads both from the arguments itself, so the paths' wrong outputs fail it."""
    from attnlab.core import prepare as pr
    from attnlab.core.call import Call

    if bug == "window sides swapped":
        monkeypatch.setattr(pr, "normalise_window", lambda w: None if w is None else tuple(reversed(w)))
        kw = dict(local_window_size=(16, 4))
    else:
        real = Call.__init__
        monkeypatch.setattr(Call, "__init__", lambda self, problem, scale, *a, **k: real(
            self, problem, 1.0 / problem.head_dim, *a, **k))
        kw = {}
    q, k, v = random_qkv(2, 64, 64, 4, 2, 32, "float32", seed=4)
    out = attnlab.attention(q, k, v, implementation="xla", **kw)
    assert not check_close(out, q, k, v, **kw).ok
