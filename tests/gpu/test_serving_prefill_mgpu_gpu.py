"""A serving step's prefill chunks on the Mosaic GPU kernel (``ServingConfig(prefill_slots=, prefill_chunk=)``) on an
H100/H200 against float64, lengths traced inside jit: contiguous and paged, sinks and a window.

    PYTHONPATH=src python -m pytest -q -m gpu tests/gpu/test_serving_prefill_mgpu_gpu.py
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnlab
from attnlab.core import device
from attnlab.kernels.serving_plan import ServingConfig
from attnlab.reference.decode64 import check_decode_close

from test_serving_gpu import H, S, _need, batch, check_rows   # the serving kernel's GPU cases and checks

pytestmark = pytest.mark.gpu
SINKS = np.linspace(-2.0, 3.0, 32).astype(np.float32)


@pytest.mark.parametrize("page, window, sinks, stream", [(None, None, False, 0), (16, None, True, 0),
                                                         (64, 100, False, 0), (16, None, True, 1)])
def test_prefill_slots_match_float64(page, window, sinks, stream):
    """The "mixed" case (a 300-token and a 64-token chunk among decodes): the 300-token chunk in the single slot
    of 320 tokens (its first 20 rows padding), the 64-token one on the Triton prefill class (past the slot); with
    ``stream`` the slots on their own CUDA stream (an async call in the compiled step)."""
    _need()
    if device.current().compute_capability != (9, 0):
        pytest.skip("the Mosaic GPU kernel needs sm_90")
    N, K = 32, 8
    (q_len, kv, starts), (q, k, v), (kc, vc, table) = batch("mixed", N, K, page)
    T = q.shape[0]
    cfg = ServingConfig(prefill_slots=1, prefill_chunk=320, prefill_stream=stream)
    sk = jnp.asarray(SINKS) if sinks else None

    @jax.jit
    def step(q, k, v, a, b, t):
        plan = attnlab.serving_plan(a, b, total_tokens=T, kv_len_max=S, heads=N, kv_heads=K, head_dim=H,
                                    config=cfg, local_window_size=window, page_size=page)
        assert plan.prefill is not None
        return attnlab.serving_attention(q, k, v, a, b, page_table=t, implementation="attnlab-decode", plan=plan,
                                         sinks=sk, local_window_size=window)

    args = (q, kc, vc, jnp.asarray(starts), jnp.asarray(kv), table)
    if stream:
        assert "call-start" in step.lower(*args).compile().as_text()
    out = step(*args)
    assert np.isfinite(np.asarray(out, np.float32)).all()
    rules = dict(local_window_size=None if window is None else (window, 0), sinks=None if sk is None else SINKS)
    check_rows(out, q, k, v, starts, kv, **rules)
    lo, hi, n = int(starts[1]), int(starts[2]), int(kv[1])     # every row of the slot's chunk (all its row tiles)
    verdict = check_decode_close(np.asarray(out[lo:hi])[None], np.asarray(q[lo:hi])[None], np.asarray(k[1:2, :n]),
                                 np.asarray(v[1:2, :n]), [n], **rules)
    assert verdict.ok, verdict
