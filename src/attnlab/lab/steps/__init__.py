"""The lab's steps, one module each (its title, the cells it times and why, its probe, its renderer),
in the order ``attnlab run`` takes them. Importing this package imports no JAX: probes and sweeps
load what they measure with on use, and renderers are pure functions of records.

A new step is a module holding ``STEP = Step(id, title, render, sweeps=..., probe=..., cells_note=...)``,
listed once in ``ORDER`` below.
"""
from __future__ import annotations

from . import causal, cudnn, decode, environment, gqa, jax_nn, naive, next_steps, qkv, sweeps, te_fp8, timing
from ..step_types import Step

ORDER: list[Step] = [m.STEP for m in (environment, qkv, naive, jax_nn, cudnn, causal,
                                      timing, sweeps, gqa, te_fp8, next_steps, decode)]

#: {step id: Step}, in order.
STEPS: dict[str, Step] = {s.id: s for s in ORDER}

__all__ = ["ORDER", "STEPS"]
