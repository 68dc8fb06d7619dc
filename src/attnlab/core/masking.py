"""The value masked logits take: finite, as in ``jax.nn.dot_product_attention``, never ``-inf``.

jax.nn writes a masked logit as ``-0.7 * finfo(dtype).max`` with the max capped at float32's
range (its softmax runs in float32, and a float64 -1.3e308 would overflow to -inf there). attnlab's
own paths (the ``naive`` backend, ring attention, the decode kernel, the device reference) use the
same value, so masked, causal or windowed calls and their gradients produce no Inf anywhere and
pass under ``jax.debug_infs(True)``. A row that sees no key is then recognised by its visibility
mask (or a zero softmax denominator), not by an infinite row maximum.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

#: jax.nn's factor: far below any real logit, yet ``x - NEG`` stays finite for |x| < 0.3 * max.
FACTOR = 0.7
FLOAT32_MAX = float(np.finfo(np.float32).max)


def large_negative_value(dtype) -> float:
    """The masked-logit value for logits of ``dtype``: -0.7 x min(finfo(dtype).max, float32 max).

    ``ml_dtypes.finfo``, not NumPy's: newer NumPy (the H200 image's) refuses bfloat16 in ``np.finfo``.
    """
    return -FACTOR * min(float(ml_dtypes.finfo(np.dtype(dtype)).max), FLOAT32_MAX)


def large_negative(dtype):
    """``large_negative_value(dtype)`` as a JAX scalar of ``dtype``."""
    import jax.numpy as jnp  # heavy: jax, core imports no JAX

    return jnp.asarray(large_negative_value(dtype), dtype)
