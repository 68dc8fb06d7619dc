"""The lab's steps, one module each (its title, the cells it times and why, its probe, its renderer),
in the order ``attnlab run`` takes them. Importing this package imports no JAX: probes and plans
reach what they measure with through ``step_types.jax_side()`` (loaded on first use), and renderers
are pure functions of records.

A new step is a module holding ``STEP = Step(id, title, render, sweeps=..., probe=..., cells_note=...)``
(its title without a number) and its name in ``MODULES`` below: the one registry line. Everything else
derives from it: the step's number (its place in ``MODULES``, put before its title and its section's
title), ``STEPS`` (``attnlab run --sections`` and its ``--help``), and the checks that docs/cli.md's
table of steps lists every step.
"""
from __future__ import annotations

import dataclasses
import importlib

from ..step_types import Step

#: The lab's step modules, in the order ``attnlab run`` takes them (the registry: a new step adds its name here).
MODULES = ("environment", "qkv", "naive", "jax_nn", "cudnn", "causal", "timing", "sweeps", "gqa", "te_fp8",
           "next_steps", "decode")


def numbered(step: Step, number: int) -> Step:
    """``step`` with ``number`` before its title and before the title of every section it renders."""
    def render(records, cfg, plots_dir=None):
        section = step.render(records, cfg, plots_dir)
        section.title = f"{number}. {section.title}"
        return section

    render.__name__ = render.__qualname__ = step.render.__name__
    render.__doc__ = step.render.__doc__
    return dataclasses.replace(step, title=f"{number}. {step.title}", render=render)


ORDER: list[Step] = [numbered(importlib.import_module(f".{name}", __name__).STEP, i)
                     for i, name in enumerate(MODULES, start=1)]

#: {step id: Step}, in order.
STEPS: dict[str, Step] = {s.id: s for s in ORDER}

__all__ = ["MODULES", "ORDER", "STEPS", "numbered"]
