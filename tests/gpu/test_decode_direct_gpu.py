"""The decode kernel's one-split launch (``kernels.decode_direct``) compiled by Triton on an NVIDIA GPU: against
float64, against partials + combine, and one kernel per call (CUPTI).

    python -m pytest -q -m gpu tests/gpu/test_decode_direct_gpu.py
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab import backends
from attnlab.core import kv_quant as kq
from attnlab.kernels import decode as kd
from attnlab.kernels.pages import gather_pages, to_pages
from attnlab.reference.decode64 import check_decode_close
from attnlab.reference.inputs import random_qkv
from attnlab.reference.tolerance import rel_l2

pytestmark = pytest.mark.gpu
B, S, N, K, H = 32, 4096, 64, 8, 64          # gpt-oss's heads; a 128-key window: one split on any GPU


def _need():
    why = backends.get("attnlab-decode").available()
    if why or jax.default_backend() != "gpu":
        pytest.skip(f"attnlab-decode on a GPU: {why or 'no GPU'}")


def _kernels_per_call(fn, args) -> list[str]:
    from jax.experimental.mosaic.gpu import profiler

    _, per_iter = profiler.measure(fn, aggregate=False, iterations=3)(*args)
    return [name for name, _ in per_iter[0]]


@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("case", ["contig", "paged16-sinks", "fp8-token"])
def test_one_split_call_matches_float64_and_the_combine_in_one_kernel(T, case):
    _need()
    q, k, v = random_qkv(B, T, S, N, K, H, "bfloat16", seed=T + len(case))
    lengths = jnp.asarray([S, T, S // 2 + 3, S // 3 + 5] * (B // 4), jnp.int32)   # ragged: full, exactly T, odd
    sinks = jnp.linspace(-1.0, 3.0, N, dtype=jnp.float32) if "sinks" in case else None
    table, kw = None, {}
    if "paged" in case:
        k, v, table = to_pages(k, v, 16)
    if "fp8" in case:
        (k, ks), (v, vs) = (attnlab.quantize_kv_cache(x, "fp8", "token") for x in (k, v))
        kw = dict(k_scale=ks, v_scale=vs, kv_scale="token")
    plan = kd.make_plan(B, T, S, N, K, H, jnp.bfloat16, kd.DecodeConfig(direct_output=True), window=(128, 0),
                        kv_dtype=str(k.dtype) if kw else None)
    assert plan.direct, plan      # the one-split store (``DecodeConfig.direct_output``, the default)

    def call(direct_output):
        f = functools.partial(kd.decode_attention_pallas, window=(128, 0), sinks=sinks, page_table=table,
                              config=kd.DecodeConfig(direct_output=direct_output), interpret=False, **kw)
        return jax.jit(f)

    args = (q, k, v, lengths)
    out, combined = call(True)(*args), call(False)(*args)
    k64, v64 = (kq.dequantize(np.asarray(c), np.asarray(kw[s]), "token", "float64") if kw else c
                for c, s in ((k, "k_scale"), (v, "v_scale")))
    if table is not None:
        k64, v64 = (gather_pages(np.asarray(x), np.asarray(table)) for x in (k64, v64))
    verdict = check_decode_close(out, q, k64, v64, np.asarray(lengths), sinks=sinks, local_window_size=(128, 0))
    assert verdict.ok, verdict
    assert rel_l2(out, combined) <= 1e-3
    direct_kernels, combine_kernels = _kernels_per_call(call(True), args), _kernels_per_call(call(False), args)
    assert len(direct_kernels) == 1, direct_kernels
    assert len(combine_kernels) >= 2, combine_kernels
