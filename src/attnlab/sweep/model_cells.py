"""A model preset's phases as one sweep (``attnlab bench --model``, ``attnlab advise``).

``model_sweep(preset, phases, contexts, batch, backends)`` -> a ``ModelSweep``: the plan's entries
(``attnlab.core.model_plan``: prefill, decode T = 1 and 4, train; per layer kind) and, for each, a
``Sweep`` of one cell per backend. ``run_sweep`` runs a ModelSweep like a Sweep (``cells()``,
``name``), into one results.jsonl, resumable.
"""
from __future__ import annotations

import dataclasses

from .. import backends as backends_mod
from ..core import cell_fields
from ..core.model_plan import PlanEntry, PlanError, plan
from ..core.models import ModelPreset
from ..measure.cell import Cell
from .flags import flag_name
from .spec import Sweep, SweepError

#: Backends left out of the default (every available one): FP8 paths change the numerics of a bf16 model.
def _fp8_names() -> tuple[str, ...]:
    return tuple(n for b in backends_mod.all_backends() if b.fp8 for n in b.variant_names())


NOT_BY_DEFAULT = _fp8_names()   # every FP8 path (``Backend.fp8``): a bf16 model's numerics are not FP8's


def default_backends() -> list[str]:
    """Every registered backend that can run on this machine (``available()`` is None), FP8 ones left out."""
    return [b.name for b in backends_mod.all_backends() if b.available() is None and not b.fp8]


@dataclasses.dataclass
class ModelSweep:
    preset: ModelPreset
    entries: list[PlanEntry]
    sweeps: list[Sweep]
    name: str

    def cells(self) -> list[Cell]:
        seen, out = set(), []
        for s in self.sweeps:
            for c in s.cells():
                if c.key() not in seen:
                    seen.add(c.key())
                    out.append(c)
        return out


def model_sweep(preset: ModelPreset, phases, contexts, batch: int = 1, backends: list[str] | None = None,
                name: str | None = None, dtype: str = "bfloat16", kv_cache: tuple[str, str] | None = None) -> ModelSweep:
    """The ModelSweep of ``preset``; ``SweepError`` names a bad phase, context, batch or backend. ``kv_cache``:
    (kv_dtype, kv_scale) of a quantized cache the decode cells read (``bench --model --kv-dtype``)."""
    try:
        entries = plan(preset, phases, contexts, batch, dtype, kv_cache)
    except PlanError as e:
        raise SweepError(str(e)) from None
    be = list(backends) if backends else default_backends()
    name = name or f"model:{preset.name}"
    sweeps = [Sweep(be, name=name, **e.axes()) for e in entries]
    return ModelSweep(preset, entries, sweeps, name)


#: bench flags that set a shape the preset fixes: given with --model, they must agree with it.
SHAPE_FLAGS = {"heads": "heads", "kv_heads": "kv_heads", "head_dim": "head_dim"}
#: bench flags --model replaces (the phases and contexts set them): refused with --model.
REPLACED_FLAGS = ("seq", "q_len", "kv_len", "causal", "window", "mode", "tokens",   # --inputs: its own message;
                  *(f.name for f in cell_fields.AXES if f.name not in ("inputs", "kv_dtype")))   # --kv-dtype: kept


def check_model_flags(preset: ModelPreset, given: dict) -> None:
    """Refuse bench flags that contradict ``--model`` (a shape that differs, an axis the phases set)."""
    for flag, attr in SHAPE_FLAGS.items():
        if flag in given:
            want = getattr(preset, attr)
            vals = [v.strip() for v in str(given[flag]).split(",")]
            if vals != [str(want)]:
                raise SweepError(f"{flag_name(flag)} {given[flag]} contradicts --model {preset.name} ({attr} = {want}): "
                                 f"drop {flag_name(flag)} or the model")
    if "inputs" in given:
        raise SweepError(f"--inputs contradicts --model {preset.name}: a model's cells are measured on gaussian inputs "
                         f"(other distributions: `attnlab bench --inputs` with the shape flags)")
    if "fp8_recipe" in given:
        raise SweepError(f"--fp8-recipe contradicts --model {preset.name}: a model's cells run each backend's own "
                         f"recipe (FP8 recipes: `attnlab bench --backends cudnn-fp8 --fp8-recipe` with the shape flags)")
    for flag in REPLACED_FLAGS:
        if flag in given:
            raise SweepError(f"{flag_name(flag)} contradicts --model {preset.name}: with --model the cells come from "
                             f"--phase and --context (prefill, decode T=1,4, train)")


__all__ = ["ModelSweep", "model_sweep", "default_backends", "check_model_flags", "NOT_BY_DEFAULT"]
