"""Bad input raises attnlab's own ValueError/TypeError naming the argument and the rule."""
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab import UnsupportedError
from attnlab.reference.inputs import random_qkv

Q, K, V = random_qkv(2, 8, 12, 4, 2, 16, "float32")


def call(q=Q, k=K, v=V, *a, **kw):
    return attnlab.attention(q, k, v, *a, **kw)


BAD = [
    # (description, kwargs for call, exception, words the message must contain)
    ("rank", dict(q=Q[None]), ValueError, ["query", "rank"]),
    ("key rank", dict(k=K[None]), ValueError, ["key", "rank"]),
    ("unbatched key", dict(k=K[0], v=V[0]), ValueError, ["key batch size 1", "B=2"]),
    ("value shape", dict(v=V[:, :5]), ValueError, ["value", "key shape"]),
    ("batch", dict(k=K[:1], v=V[:1]), ValueError, ["batch"]),
    ("head dim", dict(k=K[..., :8], v=V[..., :8]), ValueError, ["head dim"]),
    ("N % K", dict(k=jnp.ones((2, 12, 3, 16)), v=jnp.ones((2, 12, 3, 16))), ValueError, ["multiple", "K=3"]),
    ("int dtype", dict(q=Q.astype(jnp.int32)), TypeError, ["query", "floating"]),
    ("mixed dtypes", dict(k=K.astype(jnp.bfloat16), v=V.astype(jnp.bfloat16)), TypeError, ["share one dtype", "bfloat16"]),
    ("bias shape", dict(bias=jnp.ones((2, 4, 8, 5))), ValueError, ["bias", "broadcastable", "S"]),
    ("bias rank", dict(bias=jnp.ones((1, 2, 4, 8, 12))), ValueError, ["bias", "at most 4"]),
    ("bias dtype", dict(bias=jnp.ones((8, 12), jnp.complex64)), TypeError, ["bias", "floating"]),
    ("mask dtype", dict(mask=jnp.ones((8, 12), jnp.float32)), TypeError, ["mask", "bool"]),
    ("mask shape", dict(mask=jnp.ones((3, 1, 8, 12), bool)), ValueError, ["mask", "dim B"]),
    ("q lengths shape", dict(query_seq_lengths=jnp.array([1, 2, 3], jnp.int32)), ValueError, ["query_seq_lengths", "(B,)"]),
    ("q lengths dtype", dict(query_seq_lengths=jnp.array([1.0, 2.0])), TypeError, ["query_seq_lengths", "integer"]),
    ("q lengths range", dict(query_seq_lengths=jnp.array([1, 9], jnp.int32)), ValueError, ["query_seq_lengths", "[0, T]"]),
    ("kv lengths range", dict(key_value_seq_lengths=jnp.array([-1, 3], jnp.int32)), ValueError, ["key_value_seq_lengths", "[0, S]"]),
    ("negative window", dict(local_window_size=-1), ValueError, ["local_window_size", ">= 0"]),
    ("negative window pair", dict(local_window_size=(2, -1)), ValueError, ["local_window_size", ">= 0"]),
    ("malformed window", dict(local_window_size=(1, 2, 3)), ValueError, ["local_window_size", "pair"]),
    ("float window", dict(local_window_size=1.5), ValueError, ["local_window_size"]),
    ("scale nan", dict(scale=float("nan")), ValueError, ["scale", "finite"]),
    ("scale inf", dict(scale=float("inf")), ValueError, ["scale", "finite"]),
    ("scale str", dict(scale="1"), TypeError, ["scale"]),
    ("is_causal float", dict(is_causal=1.0), TypeError, ["is_causal", "bool"]),
    ("is_causal float array", dict(is_causal=np.array(1.0, np.float32)), TypeError, ["is_causal", "bool"]),
    ("value head dim", dict(v=V[..., :8]), ValueError, ["value shape", "must equal key shape"]),
    ("empty scale", dict(scale=np.zeros(0, np.float32)), ValueError, ["scale must be a scalar"]),
    ("implementation", dict(implementation="flash9000"), ValueError, ["implementation", "naive", "flash9000"]),
    ("implementation type", dict(implementation=3), TypeError, ["implementation"]),
    ("head dim 0", dict(q=jnp.ones((2, 8, 4, 0)), k=jnp.ones((2, 12, 2, 0)), v=jnp.ones((2, 12, 2, 0))), ValueError, ["head dim", "0"]),
    ("no kv heads", dict(k=jnp.ones((2, 12, 0, 16)), v=jnp.ones((2, 12, 0, 16))), ValueError, ["K=0"]),
    ("not an array", dict(q=[[1.0]]), TypeError, ["query", "array"]),
]


@pytest.mark.parametrize("desc,kw,exc,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_named(desc, kw, exc, words):
    with pytest.raises(exc) as info:
        call(**kw)
    msg = str(info.value)
    for w in words:
        assert w in msg, (desc, msg)
    # raised by attnlab itself, before JAX internals
    assert "attnlab" in info.traceback[-1].path.as_posix()


@pytest.mark.parametrize("desc,kw,exc,words", BAD[:6], ids=[b[0] for b in BAD[:6]])
def test_reference_validates_too(desc, kw, exc, words):
    args = {"q": Q, "k": K, "v": V, **kw}
    with pytest.raises(exc) as info:
        attnlab.reference_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)
    assert all(w in str(info.value) for w in words), (desc, str(info.value))   # attnlab's rule, not NumPy's error


def test_forced_cudnn_on_cpu_is_unsupported_with_reason():
    with pytest.raises(UnsupportedError) as info:
        call(implementation="cudnn")
    assert isinstance(info.value, ValueError)
    assert info.value.backend == "cudnn" and "GPU" in info.value.reason
    assert str(info.value).startswith("cudnn: ")


def test_cudnn_reasons_from_spec():
    from attnlab.backends import get
    from attnlab.core.prepare import prepare

    cudnn = get("cudnn")
    f32 = prepare(Q, K, V).spec
    assert "float32" in cudnn.supports(f32)
    q, k, v = (x.astype(jnp.bfloat16) for x in random_qkv(1, 8, 8, 2, 2, 512))
    assert cudnn.supports(prepare(q, k, v).spec) == "head dim 512 > 256"
    q, k, v = (x.astype(jnp.bfloat16) for x in random_qkv(1, 8, 8, 2, 2, 20))
    assert "multiple of 8" in cudnn.supports(prepare(q, k, v).spec)
    q, k, v = (x.astype(jnp.bfloat16) for x in random_qkv(1, 8, 8, 2, 2, 64))
    assert "39576" in cudnn.supports(prepare(q, k, v, local_window_size=(2, 0)).spec)
    assert cudnn.supports(prepare(q, k, v, local_window_size=(2, 0), is_causal=True).spec) is None


def test_explain_names_choice_and_reasons():
    e = attnlab.explain(Q, K, V, is_causal=True)
    assert e.chosen == "xla"
    assert e.reasons["naive"] is None and e.reasons["xla"] is None
    assert "GPU" in e.reasons["cudnn"]
    assert "auto runs: xla" in str(e)
    assert attnlab.explain(Q, K, V).reasons["attnlab-decode"] is None    # forward only: refused when differentiated, as a named call is
    for mode in ("train", "fwd+bwd"):
        assert attnlab.explain(Q, K, V, mode=mode).reasons["attnlab-decode"] == "forward only, no backward pass"
    with pytest.raises(ValueError, match="mode must be 'fwd' or 'train' .*got 'trian'"):
        attnlab.explain(Q, K, V, mode="trian")
    # attention's arguments that pick a path are taken (and ignored: explain says what auto picks); others are not
    assert attnlab.explain(Q, K, V, implementation="cudnn-fp8", fp8_recipe="amax").chosen == "xla"
    with pytest.raises(TypeError, match="^explain.* attention does not take: causal$"):
        attnlab.explain(Q, K, V, causal=True)


def test_registry_plugs_in_a_backend():
    from attnlab import backends

    class Doubling(backends.Backend):
        name = "test-double"

        def run(self, p):
            return backends.get("naive").run(p) * 2

    with backends.registered(Doubling()):
        out = call(implementation="test-double")
        np.testing.assert_allclose(np.asarray(out), 2 * np.asarray(call(implementation="naive")), rtol=1e-6)
        assert "test-double" in attnlab.explain(Q, K, V).reasons
    assert "test-double" not in backends.names()
