"""Model presets: the attention shapes of published models, as data with their source.

Each preset is what a model's published configuration (its Hugging Face ``config.json``) says about
attention: layers, query heads N, key/value heads K, head dim H, the context it was released for,
and what changes attention's semantics (a sliding window and on which layers, a logit soft-cap,
attention sinks).
``preset(name).problem(batch, context)`` gives the ``Problem`` of one layer's prefill.
No network: the numbers are copied here, with the file they come from in ``source``.
"""
from __future__ import annotations

import dataclasses
import difflib
import re

from .problem import Problem


@dataclasses.dataclass(frozen=True)
class ModelPreset:
    name: str
    layers: int
    heads: int            # N, query heads
    kv_heads: int         # K, key/value heads (GQA when K < N)
    head_dim: int         # H
    hidden: int
    context: int          # max_position_embeddings of the config
    source: str
    window: int | None = None          # sliding window (keys before the query), None: full attention
    window_layers: str | None = None   # which layers use the window ("all", "every other layer", "N of L layers")
    softcap: float | None = None       # attention logit soft-cap (tanh), None: none
    note: str = ""
    params: float | None = None        # parameters, billions, from the model's published name/size (weights only)
    sinks: bool = False                # learned attention sinks on every layer (gpt-oss: one logit per query head)

    def __post_init__(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: heads {self.heads} not a multiple of kv_heads {self.kv_heads}")

    def problem(self, batch: int, context: int, *, dtype: str = "bfloat16", causal: bool = True) -> Problem:
        """One layer's attention at ``context`` tokens (prefill: T = S = context)."""
        window = (self.window, 0) if self.window is not None and self.window_layers == "all" else None
        return Problem(batch, context, context, self.heads, self.kv_heads, self.head_dim, dtype, causal, window)

    def kv_cache_bytes(self, context: int, itemsize: int = 2, *, windowed: bool = False) -> int:
        """K and V cache bytes of one sequence of ``context`` tokens over every layer.

        ``windowed=False``: every layer caches all ``context`` tokens. ``windowed=True``: a layer with a
        sliding window W caches only ``min(context, W + 1)`` tokens (a rolling buffer: the W keys before
        the newest query and its own), a global layer all of them."""
        per_token = 2 * self.kv_heads * self.head_dim * itemsize
        return sum(k.layers * per_token * (k.cached_tokens(context) if windowed else context)
                   for k in self.layer_kinds())

    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """The layer kinds of one forward pass: all global, all windowed, (Gemma-2, gpt-oss) half each, or
        (Gemma 3) N of L windowed."""
        if self.window is None:
            return (LayerKind("global", self.layers, None),)
        if self.window_layers == "all":
            return (LayerKind("windowed", self.layers, self.window),)
        if self.window_layers == "every other layer":
            return (LayerKind("windowed", (self.layers + 1) // 2, self.window),
                    LayerKind("global", self.layers // 2, None))
        m = re.fullmatch(r"(\d+) of (\d+) layers", self.window_layers or "")
        if m and int(m.group(2)) == self.layers and 0 < int(m.group(1)) <= self.layers:
            n = int(m.group(1))
            kinds = (LayerKind("windowed", n, self.window),)
            return kinds + ((LayerKind("global", self.layers - n, None),) if n < self.layers else ())
        raise ValueError(f"{self.name}: window_layers {self.window_layers!r} is not 'all', 'every other layer' "
                         f"or 'N of {self.layers} layers'")

    def weight_bytes(self, itemsize: int = 2) -> int | None:
        """Bytes of the weights at ``itemsize`` bytes per parameter (bf16: 2), or None without ``params``."""
        return None if self.params is None else int(round(self.params * 1e9)) * itemsize


@dataclasses.dataclass(frozen=True)
class LayerKind:
    """Layers of one attention kind: ``window`` keys before each query (None: global, full causal)."""
    kind: str             # "global" or "windowed"
    layers: int
    window: int | None

    def cached_tokens(self, context: int) -> int:
        """Tokens this kind of layer keeps in its KV cache at ``context`` (rolling buffer when windowed)."""
        return context if self.window is None else min(context, self.window + 1)


_HF = "https://huggingface.co/{}/blob/main/config.json"

PRESETS: tuple[ModelPreset, ...] = (
    ModelPreset("llama-3.1-8b", 32, 32, 8, 128, 4096, 131072, _HF.format("meta-llama/Llama-3.1-8B"), params=8.03),
    ModelPreset("llama-3.1-70b", 80, 64, 8, 128, 8192, 131072, _HF.format("meta-llama/Llama-3.1-70B"), params=70.6),
    ModelPreset("llama-3.1-405b", 126, 128, 8, 128, 16384, 131072, _HF.format("meta-llama/Llama-3.1-405B"), params=405.9),
    ModelPreset("mistral-7b", 32, 32, 8, 128, 4096, 32768, _HF.format("mistralai/Mistral-7B-v0.1"), window=4096,
                window_layers="all", note="v0.1 (sliding_window 4096); v0.2 and later have none", params=7.24),
    ModelPreset("mixtral-8x7b", 32, 32, 8, 128, 4096, 32768, _HF.format("mistralai/Mixtral-8x7B-v0.1"),
                note="sliding_window null; 8 experts are in the MLP, attention is dense", params=46.7),
    ModelPreset("qwen2.5-7b", 28, 28, 4, 128, 3584, 131072, _HF.format("Qwen/Qwen2.5-7B"),
                note="use_sliding_window false", params=7.62),
    ModelPreset("qwen2.5-72b", 80, 64, 8, 128, 8192, 131072, _HF.format("Qwen/Qwen2.5-72B"),
                note="use_sliding_window false", params=72.7),
    ModelPreset("gemma-2-9b", 42, 16, 8, 256, 3584, 8192, _HF.format("google/gemma-2-9b"), window=4096,
                window_layers="every other layer", softcap=50.0, note="query_pre_attn_scalar 256", params=9.24),
    ModelPreset("gemma-2-27b", 46, 32, 16, 128, 4608, 8192, _HF.format("google/gemma-2-27b"), window=4096,
                window_layers="every other layer", softcap=50.0,
                note="query_pre_attn_scalar 144: logits scaled by 1/sqrt(144), not 1/sqrt(H)", params=27.2),
    ModelPreset("gemma-3-1b", 26, 4, 1, 256, 1152, 32768, _HF.format("google/gemma-3-1b-pt"), window=512,
                window_layers="22 of 26 layers", note="sliding_window_pattern 6: every 6th layer global", params=1.0),
    ModelPreset("gemma-3-4b", 34, 8, 4, 256, 2560, 131072, _HF.format("google/gemma-3-4b-pt"), window=1024,
                window_layers="29 of 34 layers", note="sliding_window_pattern 6: every 6th layer global (text_config)",
                params=4.3),
    ModelPreset("gemma-3-12b", 48, 16, 8, 256, 3840, 131072, _HF.format("google/gemma-3-12b-pt"), window=1024,
                window_layers="40 of 48 layers", note="sliding_window_pattern 6: every 6th layer global (text_config)",
                params=12.2),
    ModelPreset("gemma-3-27b", 62, 32, 16, 128, 5376, 131072, _HF.format("google/gemma-3-27b-pt"), window=1024,
                window_layers="52 of 62 layers", note="sliding_window_pattern 6: every 6th layer global (text_config); "
                "query_pre_attn_scalar 168: logits scaled by 1/sqrt(168), not 1/sqrt(H)", params=27.4),
    ModelPreset("gpt-oss-20b", 24, 64, 8, 64, 2880, 131072, _HF.format("openai/gpt-oss-20b"), window=128,
                window_layers="every other layer", sinks=True,
                note="layer_types alternate sliding_attention (128) and full_attention; "
                "32 experts in the MLP, attention dense", params=20.9),
    ModelPreset("gpt-oss-120b", 36, 64, 8, 64, 2880, 131072, _HF.format("openai/gpt-oss-120b"), window=128,
                window_layers="every other layer", sinks=True,
                note="layer_types alternate sliding_attention (128) and full_attention; "
                "128 experts in the MLP, attention dense", params=116.8),
    ModelPreset("phi-3-mini", 32, 32, 32, 96, 3072, 4096, _HF.format("microsoft/Phi-3-mini-4k-instruct"),
                window=2047, window_layers="all", note="4k-instruct; head dim 96 (cuDNN needs a multiple of 8: ok)", params=3.82),
)
BY_NAME = {p.name: p for p in PRESETS}


def nearest(name: str, n: int = 3) -> list[str]:
    """Up to ``n`` preset names closest to ``name`` (its organisation and case ignored), best first:
    difflib's ratio >= 0.6 (``llama-4`` -> the three Llama-3.1 presets; ``gpt-5`` -> none)."""
    return difflib.get_close_matches(str(name).strip().split("/")[-1].lower(), list(BY_NAME), n=n, cutoff=0.6)


def suggestions(name: str) -> str:
    """``nearest: llama-3.1-405b, llama-3.1-8b, llama-3.1-70b; presets: llama-3.1-8b, ...``: the presets
    nearest ``name`` (when any are near) and every preset, for the error of an unknown model."""
    near = nearest(name)
    return (f"nearest: {', '.join(near)}; " if near else "") + f"presets: {', '.join(BY_NAME)}"


def preset(name: str) -> ModelPreset:
    """The preset called ``name`` (case-insensitive), or ValueError naming the nearest presets and
    listing every one (``suggestions``)."""
    try:
        return BY_NAME[name.lower()]
    except KeyError:
        raise ValueError(f"model: unknown preset {name!r}; {suggestions(name)}") from None


__all__ = ["ModelPreset", "PRESETS", "BY_NAME", "preset", "nearest", "suggestions"]
