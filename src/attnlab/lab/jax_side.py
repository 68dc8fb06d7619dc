"""What the lab's probes and plans measure with: JAX, attnlab's API and backends, the float64 reference, the
device's roofs, the compiled-memory probe and the sweep engine's ``Sweep``, imported at this module's top.

The step modules (``attnlab.lab.steps``) import no JAX, so that their renderers (``attnlab.lab.render``) and
``attnlab run --help`` run without it. A probe or a plan reaches this module through
``step_types.jax_side()``, the lab's one deferred import: it is loaded when a step first measures or plans,
never when a step is rendered. Import-linter sees its imports here, so the layers are checked as before.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import backends
from ..api import dot_product as api
from ..backends.cudnn import hlo_uses_cudnn
from ..measure.peaks import measure_ceilings, peak_tflops, roofs
from ..reference.float64 import check_close, default_matmul_is_tf32, reference_attention
from ..reference.inputs import random_qkv
from ..sweep.spec import Sweep
from .memory_probe import compiled_temp


def qkv_inputs(cfg, dtype: str = "float32", seed: int = 0):
    """(q, k, v) of the lab config's (``step_types.LabConfig``, which imports this module) default shape: q (B, T, N, H), k and v (B, S, N, H), T = S, standard normal."""
    return random_qkv(cfg.batch, cfg.q_len, cfg.q_len, cfg.heads, cfg.heads, cfg.head_dim, dtype, seed)


__all__ = ["jax", "jnp", "api", "backends", "hlo_uses_cudnn", "check_close", "reference_attention",
           "default_matmul_is_tf32", "measure_ceilings", "peak_tflops", "roofs", "Sweep", "compiled_temp",
           "qkv_inputs"]
