"""attention and decode_attention validate through one set of helpers (core/checks.py; the sizes are
Problem's own rules), and the package's lazy names come from one loader (names.lazy_getattr): each call
still names its own arguments."""
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
import attnlab.lab
from attnlab.api.decode import prepare_decode
from attnlab.core.names import lazy_getattr
from attnlab.core.problem import ProblemError
from attnlab.core.prepare import prepare

Q = np.zeros((2, 1, 4, 16), np.float32)
KV = np.zeros((2, 8, 2, 16), np.float32)
LENGTHS = np.array([4, 8])


def test_mixed_dtypes_name_each_calls_own_arguments():
    with pytest.raises(TypeError, match=r"^query, key and value must share one dtype, got query float32, "
                                        r"key bfloat16, value bfloat16$"):
        prepare(Q, KV.astype(jnp.bfloat16), KV.astype(jnp.bfloat16))
    with pytest.raises(TypeError, match=r"^q, k_cache and v_cache must share one dtype, got q bfloat16, "
                                        r"k_cache float32, v_cache float32$"):
        prepare_decode(Q.astype(jnp.bfloat16), KV, KV, LENGTHS)
    with pytest.raises(TypeError, match=r"^k_cache must have a floating dtype"):
        prepare_decode(Q, KV.astype(np.int32), KV, LENGTHS)


@pytest.mark.parametrize("call, match", [
    (lambda: prepare_decode(Q[:, :, :3], KV, KV, LENGTHS), r"^q heads N=3 must be a multiple of k_cache heads K=2$"),
    (lambda: prepare_decode(Q[..., :0], KV[..., :0], KV[..., :0], LENGTHS), r"^q head dim H=0 must be >= 1$"),
    (lambda: prepare_decode(Q[:, :, :3], KV.reshape(4, 4, 2, 16), KV.reshape(4, 4, 2, 16), LENGTHS,   # paged
                            page_table=np.array([[0, 1], [2, 3]], np.int32)), r"^q heads N=3 must be a multiple"),
    (lambda: prepare(Q[:, :, :3], KV, KV), r"^query heads N=3 must be a multiple of key/value heads K=2$"),
    (lambda: prepare(Q[:, :0], KV, KV), r"^query length T=0 must be >= 1$"),
])
def test_size_errors_are_problems_rules_in_each_calls_words(call, match):
    with pytest.raises(ProblemError, match=match) as e:
        call()
    cause = e.value.__cause__           # the rule broken is Problem's, raised by Problem.__post_init__
    assert isinstance(cause, ProblemError) and cause.fields == e.value.fields
    tb = cause.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    assert (tb.tb_frame.f_code.co_name, os.path.basename(tb.tb_frame.f_code.co_filename)) == ("__post_init__",
                                                                                             "problem.py")


def test_decode_scale_static_or_traced():
    assert prepare_decode(Q, KV, KV, LENGTHS, scale=np.float32(0.5)).spec.scale == 0.5
    assert prepare_decode(Q, KV, KV, LENGTHS).spec.scale_is_static
    seen = []
    jax.jit(lambda s: seen.append(prepare_decode(Q, KV, KV, LENGTHS, scale=s).spec) or s)(jnp.float32(0.5))
    assert isinstance(seen[0].scale, jax.core.Tracer) and not seen[0].scale_is_static   # the scale the call runs with
    with pytest.raises(ValueError, match="scale must be finite, got -inf"):
        prepare_decode(Q, KV, KV, LENGTHS, scale=-math.inf)
    with pytest.raises(TypeError, match="scale must be a finite float or None, got True"):
        prepare_decode(Q, KV, KV, LENGTHS, scale=True)


def test_lazy_names_are_loaded_once_and_unknown_ones_name_the_package():
    assert attnlab.Problem is attnlab.__dict__["Problem"]          # cached in the package after first use
    assert callable(attnlab.lab.run_lab) and "run_lab" in attnlab.lab.__dict__
    for pkg, name in ((attnlab, "attnlab"), (attnlab.lab, "attnlab.lab")):
        with pytest.raises(AttributeError, match=f"module '{name}' has no attribute 'nope'"):
            pkg.nope
    with pytest.raises(ModuleNotFoundError):
        lazy_getattr("attnlab", {"x": ".no_such_module"})("x")
