"""A model's phases as attention cells (issue 16): what ``bench --model`` and ``advise`` measure.

Pure data, no JAX: ``plan(preset, phases, contexts, batch)`` gives one ``PlanEntry`` per (phase,
context, layer kind, decode step), each one layer's attention at that context:

- ``prefill``: causal forward, T = S = context;
- ``decode``: T = 1 and T = 4 new tokens per sequence against a full cache of the context
  (``decode_attention``, ``Cell(lengths="full")``, causal);
- ``train``: causal forward + backward, T = S = context.

Layer kinds come from ``ModelPreset.layer_kinds``: a window on every layer (Mistral 4096, Phi-3-mini
2047) is the problem's window ``(W, 0)``; Gemma-2 has windowed and global layers, each measured.
A windowed layer's decode is measured against the cache a rolling buffer holds (``decode_attention``'s
``local_window_size`` on the whole cache, the other way a server runs it, is not measured here):
``min(context, W + T)`` tokens (exact for T = 1: the W keys before the query and its own; for T > 1 the
first queries see up to T - 1 keys more than their window).
The attention logit soft-cap (Gemma-2: 50) is measured: every cell of such a model carries it
(``soft_cap``), so only backends that apply it (naive, tokamax, attnlab-decode) can be its fastest.
So are attention sinks (gpt-oss, every layer: ``sinks``; naive, xla and attnlab-decode apply them).
"""
from __future__ import annotations

import dataclasses

from .cell_fields import DEFAULTS, record_values
from .models import LayerKind, ModelPreset

PHASES = ("prefill", "decode", "train")
DECODE_T = (1, 4)
MODE = {"prefill": "fwd", "decode": "fwd", "train": "fwd+bwd"}


class PlanError(ValueError):
    """A phase, context or batch that cannot be planned (names the bad value)."""


def parse_contexts(text) -> list[int]:
    """"4k,32k,128k" or "256,1024" (k = 1024) -> token counts; ValueError names a bad entry."""
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    out = []
    for it in items:
        t = str(it).strip().lower()
        try:
            v = int(t[:-1]) * 1024 if t.endswith("k") else int(t)
        except ValueError:
            raise PlanError(f"context: {it!r} is not a token count (an int, or Nk with k = 1024: 4k, 32k, 128k)") from None
        if v < 1:
            raise PlanError(f"context: {it!r} must be at least 1 token")
        out.append(v)
    if not out:
        raise PlanError("context: no value given")
    return list(dict.fromkeys(out))


def parse_phases(text) -> list[str]:
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    out = [str(p).strip().lower() for p in items if str(p).strip()]
    for p in out:
        if p not in PHASES:
            raise PlanError(f"phase: {p!r} is not one of {', '.join(PHASES)}")
    if not out:
        raise PlanError("phase: no value given")
    return list(dict.fromkeys(out))


@dataclasses.dataclass(frozen=True)
class PlanEntry:
    """One layer kind's attention in one phase at one context: the cell shape every backend runs."""
    phase: str
    context: int           # tokens in the sequence (the cache, for decode)
    kind: str              # "global" or "windowed"
    layers: int            # layers of this kind in the model
    batch: int
    q_len: int             # T
    kv_len: int            # S (decode of a windowed layer: the rolling buffer's tokens)
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    window: tuple[int, int] | None
    mode: str
    lengths: str | None    # "full": a decode cell
    soft_cap: float | None = None   # the model's attention logit soft-cap
    sinks: bool = False             # the model's attention sinks (gpt-oss: every layer)
    kv_cache: tuple[str, str] | None = None   # decode: a quantized cache's (kv_dtype, kv_scale); None: dtype's

    def axes(self) -> dict:
        """The ``Sweep`` keyword axes of this entry (one value each), without backends."""
        return dict(batch=[self.batch], q_len=[self.q_len], kv_len=[self.kv_len], heads=[self.heads],
                    kv_heads=[self.kv_heads], head_dim=[self.head_dim], dtype=[self.dtype], causal=[True],
                    window=[self.window], mode=[self.mode], lengths=[self.lengths], soft_cap=[self.soft_cap],
                    sinks=[self.sinks], kv_dtype=[self.kv_cache])

    def matches(self, rec: dict) -> bool:
        """Whether ``rec`` is a record of this entry's cell (any backend, one device): its shape, mode and every
        identity field (``core.cell_fields``; those the entry leaves out at their defaults) are the entry's."""
        want = {**DEFAULTS, **{k: v[0] for k, v in self.axes().items()}}
        w = rec.get("window")
        want["kv_dtype"], want["kv_scale"] = self.kv_cache or (None, None)     # the axis's (dtype, layout) pair
        have = {**{k: rec.get(k) for k in ("batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "dtype", "mode")},
                "causal": bool(rec.get("causal")), "window": tuple(w) if w else None, **record_values(rec)}
        return all(have[k] == want[k] for k in have)


def plan(preset: ModelPreset, phases, contexts, batch: int = 1, dtype: str = "bfloat16",
         kv_cache: tuple[str, str] | None = None) -> list[PlanEntry]:
    """Every entry of ``phases`` x ``contexts`` x layer kinds (x decode T) of ``preset``; ``kv_cache``
    ((kv_dtype, kv_scale), e.g. ("float8_e4m3fn", "token")): the decode entries read a cache quantized so
    (prefill and train read none).

    A windowed kind whose window covers the whole context (W >= context - 1) is the global kind:
    measured once, as "global", with all those layers (``notes`` says so)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise PlanError(f"batch: {batch!r} is not a positive integer")
    phases, contexts = parse_phases(phases), parse_contexts(contexts)
    out = []
    for phase in phases:
        for ctx in contexts:
            for kind in _kinds(preset, ctx):
                common = dict(phase=phase, context=ctx, kind=kind.kind, layers=kind.layers, batch=batch,
                              heads=preset.heads, kv_heads=preset.kv_heads, head_dim=preset.head_dim, dtype=dtype,
                              mode=MODE[phase], soft_cap=preset.softcap, sinks=preset.sinks)
                if phase == "decode":
                    for t in DECODE_T:
                        if t > ctx:
                            continue
                        s = ctx if kind.window is None else min(ctx, kind.window + t)
                        out.append(PlanEntry(q_len=t, kv_len=s, window=None, lengths="full", kv_cache=kv_cache,
                                             **common))
                else:
                    w = None if kind.window is None else (kind.window, 0)
                    out.append(PlanEntry(q_len=ctx, kv_len=ctx, window=w, lengths=None, **common))
    return out


def _kinds(preset: ModelPreset, context: int) -> list[LayerKind]:
    kinds = preset.layer_kinds()
    if all(k.window is None or k.window >= context - 1 for k in kinds):
        return [LayerKind("global", preset.layers, None)]
    return list(kinds)


def notes(preset: ModelPreset, contexts) -> list[str]:
    """What the plan models and what it does not, said in the output of bench --model and advise."""
    out = []
    kinds = preset.layer_kinds()
    if any(k.window is not None for k in kinds):
        which = "every layer" if preset.window_layers == "all" else (
            " and ".join(f"{k.layers} {k.kind}" for k in kinds) + " layers (measured separately, weighted by count)")
        out.append(f"{preset.name}: sliding window {preset.window} on {which}; prefill/train run with window "
                   f"({preset.window}, 0); decode of a windowed layer runs against the rolling buffer's "
                   f"min(context, {preset.window} + T) tokens")
        for c in parse_contexts(contexts):
            if preset.window >= c - 1:
                out.append(f"context {c}: the window {preset.window} covers the whole sequence, so every layer is "
                           f"measured as global")
    if preset.softcap is not None:
        out.append(f"{preset.name}: attention logit soft-cap {preset.softcap:g} measured (logits_soft_cap on every "
                   f"cell); backends without a soft cap (cuDNN, xla, TransformerEngine, PyTorch) are unsupported")
    if preset.sinks:
        out.append(f"{preset.name}: attention sinks on every layer measured (sinks on every cell: one logit per query "
                   f"head, standard normal); backends without sinks (cuDNN, tokamax, TransformerEngine, PyTorch) are "
                   f"unsupported")
    if preset.note:
        out.append(f"{preset.name}: {preset.note}")
    return out


__all__ = ["PHASES", "DECODE_T", "PlanEntry", "PlanError", "parse_contexts", "parse_phases", "plan", "notes"]
