"""``--model`` in any form: a preset, a Hugging Face id of one or of a variant, or a ``config.json``.

``resolve(text)`` -> a ``ModelPreset``:

- a preset name (``attnlab models``), any case: ``llama-3.1-8b``;
- a Hugging Face id whose base model is a preset: the id a preset was copied from
  (``meta-llama/Llama-3.1-8B``) or a tuned variant of it, which has the same attention
  (``meta-llama/Llama-3.1-8B-Instruct``, ``google/gemma-2-9b-it``, ``...-Chat``, ``-hf``, ``-base``,
  the older ``Meta-`` prefix), with or without its organisation; case, dashes, dots and underscores are
  ignored (``llama3.1-8b``, ``Llama_3.1_8B``);
- a path to a model's ``config.json``, or a folder that holds one (nothing is fetched): ``from_config``
  reads it.

An unknown name raises ``ModelConfigError`` with the nearest presets (difflib) and every preset.

``from_config(cfg, name)`` reads num_attention_heads, num_key_value_heads (default: the heads),
head_dim (else hidden_size / heads), num_hidden_layers, max_position_embeddings, the sliding window
(sliding_window with use_sliding_window, layer_types, Gemma-2's alternation, Gemma-3's
sliding_window_pattern), attn_logit_softcapping and query_pre_attn_scalar, and sinks for gpt-oss (model_type
gpt_oss: its learned sinks are weights, no config field says so); a multimodal config's
``text_config`` is read when the top level has no heads. A field it cannot interpret raises
``ModelConfigError`` naming the field and why.
"""
from __future__ import annotations

import json
import math
import os
import re

from .models import BY_NAME, PRESETS, ModelPreset, suggestions

#: Fields that change attention in ways attnlab's cells do not model: refused, named.
UNINTERPRETED = {
    "kv_lora_rank": "multi-head latent attention (DeepSeek MLA): K/V come from a low-rank latent",
    "q_lora_rank": "multi-head latent attention (DeepSeek MLA)",
    "attention_chunk_size": "chunked local attention (Llama 4)",
}
SLIDING, FULL = "sliding_attention", "full_attention"


class ModelConfigError(ValueError):
    """A --model that is no preset, alias or readable config, or a config field that cannot be interpreted."""


#: Name parts of a tuned variant whose attention is its base model's (dropped before matching).
VARIANT_PARTS = ("instruct", "it", "chat", "hf", "base", "meta")


def base_name(text: str) -> str:
    """The model name of ``text`` without its organisation and variant parts, lower case:
    ``meta-llama/Meta-Llama-3.1-8B-Instruct`` -> ``llama-3.1-8b``, ``google/gemma-2-9b-it`` -> ``gemma-2-9b``."""
    parts = re.split(r"[-_ ]", str(text).strip().split("/")[-1].lower())
    return "-".join(p for p in parts if p and p not in VARIANT_PARTS)


def _squash(text: str) -> str:
    return re.sub(r"[-._ ]", "", base_name(text))


def _hf_id(p: ModelPreset) -> str:
    m = re.search(r"huggingface\.co/([^/]+/[^/]+)/", p.source)
    return m.group(1) if m else p.name


ALIASES = {}
for _p in PRESETS:
    ALIASES[_squash(_p.name)] = _p
    ALIASES[_squash(_hf_id(_p))] = _p


def resolve(text: str) -> ModelPreset:
    """The preset, Hugging Face id, config.json or folder ``text`` names (see the module docstring)."""
    t = str(text).strip()
    if t.lower() in BY_NAME:
        return BY_NAME[t.lower()]
    if os.path.isdir(t) and os.path.isfile(os.path.join(t, "config.json")):
        return load_config(os.path.join(t, "config.json"))
    if t.endswith(".json") or os.path.isfile(t):
        return load_config(t)
    hit = ALIASES.get(_squash(t))
    if hit is not None:
        return hit
    folder = f" (the folder {t} holds no config.json)" if os.path.isdir(t) else ""
    raise ModelConfigError(f"model: {t!r} is no preset, Hugging Face id or alias of one, nor a config.json or a "
                           f"folder holding one{folder}; {suggestions(base_name(t))}")


def load_config(path: str) -> ModelPreset:
    try:
        with open(path) as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise ModelConfigError(f"model: config file {path} not found") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ModelConfigError(f"model: config file {path} cannot be read as JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"model: config file {path} holds no JSON object")
    name = cfg.get("_name_or_path") or os.path.basename(os.path.dirname(os.path.abspath(path))) or "config"
    return from_config(cfg, str(name), source=os.path.abspath(path))


def _int(cfg: dict, field: str, *, default=None, required=True) -> int | None:
    v = cfg.get(field, default)
    if v is None:
        if required:
            raise ModelConfigError(f"config: {field} is missing (needed for attention's shape)")
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ModelConfigError(f"config: {field} = {v!r} is not a positive integer")
    return v


def _number(cfg: dict, field: str) -> float | None:
    v = cfg.get(field)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
        raise ModelConfigError(f"config: {field} = {v!r} is not a positive number")
    return float(v)


def _layer_types(cfg: dict, layers: int) -> list[str] | None:
    """The config's ``layer_types``, checked: one of ``SLIDING``/``FULL`` per layer, or None."""
    types = cfg.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != layers:
        raise ModelConfigError(f"config: layer_types must list one entry per layer ({layers}), got {types!r:.80}")
    bad = sorted({repr(x) for x in types if x not in (SLIDING, FULL)})
    if bad:
        raise ModelConfigError(f"config: layer_types entries {', '.join(bad)} are not {SLIDING} or {FULL}")
    return types


def _window(cfg: dict, layers: int) -> tuple[int | None, str | None]:
    """(window W, which layers) from the config's sliding-window fields."""
    sw = cfg.get("sliding_window")
    types = _layer_types(cfg, layers)
    if sw is None or cfg.get("use_sliding_window") is False:
        if types and SLIDING in types:
            why = "sliding_window is null" if sw is None else "use_sliding_window is false"
            raise ModelConfigError(f"config: layer_types has {SLIDING} layers but {why}")
        return None, None
    if isinstance(sw, bool) or not isinstance(sw, int) or sw < 1:
        raise ModelConfigError(f"config: sliding_window = {sw!r} is not a positive integer or null")
    if types is not None:
        n = types.count(SLIDING)
    elif cfg.get("sliding_window_pattern") is not None:    # Gemma-3: every pattern-th layer is global
        pattern = cfg["sliding_window_pattern"]
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise ModelConfigError(f"config: sliding_window_pattern = {pattern!r} is not a positive integer")
        n = layers - layers // pattern
    elif cfg.get("model_type") == "gemma2":    # Gemma-2 alternates windowed and global layers
        return sw, "every other layer"
    else:
        return sw, "all"
    return (sw, "all") if n == layers else (None, None) if n == 0 else (sw, f"{n} of {layers} layers")


def from_config(cfg: dict, name: str = "config", source: str = "config.json") -> ModelPreset:
    """A ``ModelPreset`` from a Hugging Face config dict (see the module docstring)."""
    if "num_attention_heads" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "_name_or_path": cfg.get("_name_or_path")}
    for field, why in UNINTERPRETED.items():
        if cfg.get(field) is not None:
            raise ModelConfigError(f"config: {field} = {cfg[field]!r} cannot be interpreted: {why}")
    heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise ModelConfigError(f"config: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    layers = _int(cfg, "num_hidden_layers")
    hidden = _int(cfg, "hidden_size", required=False)
    head_dim = _int(cfg, "head_dim", required=False)
    if head_dim is None:
        if hidden is None:
            raise ModelConfigError("config: head_dim is missing and so is hidden_size (head_dim = hidden_size / heads)")
        if hidden % heads:
            raise ModelConfigError(f"config: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; "
                                   "give head_dim")
        head_dim = hidden // heads
    context = _int(cfg, "max_position_embeddings")
    window, where = _window(cfg, layers)
    cap = _number(cfg, "attn_logit_softcapping")
    scalar = _number(cfg, "query_pre_attn_scalar")
    note = f"from {source}"
    if scalar is not None and scalar != head_dim:
        note += f"; query_pre_attn_scalar {scalar:g}: logits scaled by 1/sqrt({scalar:g}), not 1/sqrt(H)"
    sinks = cfg.get("model_type") == "gpt_oss"     # gpt-oss: learned sinks on every layer (weights, no config field)
    return ModelPreset(str(name), layers, heads, kv_heads, head_dim, hidden or heads * head_dim, context, source,
                       window=window, window_layers=where, softcap=cap, note=note, sinks=sinks)


__all__ = ["resolve", "from_config", "load_config", "base_name", "ModelConfigError", "ALIASES"]
