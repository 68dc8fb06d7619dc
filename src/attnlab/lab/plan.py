"""What the lab's measuring steps share in their plans: the lab sized to its questions.

Every timed cell costs a compile, a check and its timing (2-3 s on a GPU), so each step holds only
the cells its answer needs, and shares cells where it can: the sequence sweep runs at the default
shape's B, N and H, so the timing step's cells, the batch sweep's B = default, the head-dim sweep's
default H and TransformerEngine's XLA/cuDNN baselines are the same cells, measured once (the
sweep engine finds them in its folder). Each step's own plan (its sweeps, and ``cells_note(cfg)``:
which cells ran and why, said in its text) is in its module of ``attnlab.lab.steps``. Pure: no JAX.
"""
from __future__ import annotations

from .step_types import LabConfig


def perf_backends(cfg: LabConfig) -> list[str]:
    """The paths the performance steps compare: unfused XLA and the fused cuDNN kernel on a GPU;
    naive and XLA on a CPU (no fused kernel runs there). Naive is the same math as XLA on a GPU."""
    return ["xla", "cudnn"] if cfg.gpu else ["naive", "xla"]
