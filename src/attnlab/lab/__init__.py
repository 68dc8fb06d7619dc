"""``attnlab run``: the codelab as one command. Each step's records are written as they finish.

A step (``step_types.Step``, one module of ``attnlab.lab.steps`` each) declares the cells it times as
sweeps (run by the sweep engine, so a stopped run resumes), probes what is not timed, and is
rendered by a pure function of the records (``attnlab.lab.render``: no JAX). Importing this
package imports no JAX: ``run_lab`` loads the measuring modules on first use.
"""
from __future__ import annotations

from ..core.names import lazy_getattr
from .step_types import LabConfig, LabContext, Section, Step, Table

_LAZY = {"run_lab": ".run", "STEPS": ".steps", "config_for_machine": ".run", "run_step": ".run"}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = ["run_lab", "Section", "Table", "LabConfig", "LabContext", "Step", "STEPS", "config_for_machine"]
