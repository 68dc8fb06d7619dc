"""Sweep values as given on the command line or in a TOML file, parsed into typed axis values.

Each parser takes a CLI string (``"1,2,4"``, ``"none,128:0"``) or the TOML value (an int, a
list) and returns the axis's list of values; every bad value raises ``SweepError`` naming the axis
and the rule. ``load_toml`` reads a sweep file's [sweep] and [run] tables.
"""
from __future__ import annotations

import os
import tomllib

from .. import backends
from ..core.kv_quant import SCALE_LAYOUTS, canonical_kv_dtype
from ..core.request_lengths import DISTRIBUTIONS
from ..measure.cell_type import LENGTHS


class SweepError(ValueError):
    """A sweep definition that cannot be run (bad axis value, bad file)."""


def once(axis: str, vals) -> None:
    """``SweepError`` for a value given twice on one axis (``--seq 16,16``: a cell measured twice, and
    the estimate and cost line counting it twice), compared as the cells read it (f32 = float32)."""
    seen = set()
    for v in vals:
        key = tuple(v) if isinstance(v, list) else v
        if key in seen:
            shown = ("none" if v is None else str(v).lower() if isinstance(v, bool) else
                     ":".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v))
            raise SweepError(f"{axis}: {shown} given twice; give each value once")
        seen.add(key)


def _ints(axis: str, text) -> list[int]:
    if isinstance(text, (list, tuple)):
        vals = list(text)
    elif isinstance(text, int):
        vals = [text]
    else:
        vals = []
        for part in str(text).split(","):
            part = part.strip()
            try:
                vals.append(int(part))
            except ValueError:
                raise SweepError(f"{axis}: {part!r} is not an integer") from None
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SweepError(f"{axis}: {v!r} is not a positive integer")
    once(axis, vals)
    return vals


def _strs(text) -> list[str]:
    if isinstance(text, (list, tuple)):
        return [str(x) for x in text]
    return [p.strip() for p in str(text).split(",") if p.strip()]


def _causal(text, axis: str = "causal") -> list[bool]:
    """A bool axis (causal, sinks): true, false or both, or a TOML bool or list of them."""
    if isinstance(text, bool):
        return [text]
    if isinstance(text, (list, tuple)):
        return [_causal(x, axis)[0] for x in text]
    t = str(text).strip().lower()
    table = {"both": [False, True], "true": [True], "yes": [True], "1": [True], "false": [False], "no": [False], "0": [False]}
    if t not in table:
        raise SweepError(f"{axis}: {text!r} must be true, false or both")
    return table[t]


def _windows(text) -> list[tuple[int, int] | None]:
    """"none,128:0" (CLI) or a TOML list of entries, each "none", "L:R", [L, R] or an int W.

    An int W is (W, W), as ``jax.nn.dot_product_attention`` reads ``local_window_size=W``: W keys
    before and W keys after each query (2W + 1 in all), not a causal window of W keys."""
    if isinstance(text, str):
        items = [p.strip() for p in text.split(",")]
    elif isinstance(text, (list, tuple)):
        items = list(text)
    else:
        items = [text]
    out = []
    for it in items:
        if it is None or (isinstance(it, str) and it.lower() in ("none", "")):
            out.append(None)
            continue
        parts = list(it) if isinstance(it, (list, tuple)) else str(it).split(":")
        try:
            vals = [int(p) for p in parts]
        except (TypeError, ValueError):
            raise SweepError(f"window: {it!r} must be none or LEFT:RIGHT (e.g. 128:0)") from None
        if len(vals) == 1:
            vals = vals * 2
        if len(vals) != 2 or min(vals) < 0:
            raise SweepError(f"window: {it!r} must be none or LEFT:RIGHT with non-negative ints")
        out.append((vals[0], vals[1]))
    return out


def with_fp8_recipes(names: list[str], recipes: list[str]) -> list[str]:
    """The sweep axis ``fp8_recipe``: a backend among ``names`` that takes FP8 recipes (``cudnn-fp8``:
    ``backends.recipe_backends()``) becomes one backend per recipe (``hadamard`` -> ``cudnn-fp8-hadamard``,
    the name its records carry; ``amax`` -> ``cudnn-fp8``)."""
    takers = [n for n in names if n in backends.recipe_backends()]
    if not takers:
        raise SweepError(f"fp8_recipe: needs the {' or '.join(backends.recipe_backends())} backend among the "
                         f"backends, got {', '.join(names)}")
    try:
        variants = {n: [backends.get(n).recipe_variant(r.lower()) for r in recipes] for n in takers}
    except ValueError as e:
        raise SweepError(str(e)) from None
    out = []
    for n in names:
        out.extend(variants.get(n, [n]))
    return list(dict.fromkeys(out))


def _caps(text) -> list[float | None]:
    """"none,50" (CLI) or a TOML list: logits soft caps, none = uncapped."""
    items = list(text) if isinstance(text, (list, tuple)) else [text] if isinstance(text, (int, float)) else _strs(text)
    out = []
    for it in items:
        if it is None or str(it).strip().lower() == "none":
            out.append(None)
            continue
        try:
            v = float(it)
        except (TypeError, ValueError):
            raise SweepError(f"soft_cap: {it!r} is not none or a positive number (e.g. 50)") from None
        if not 0 < v < float("inf"):
            raise SweepError(f"soft_cap: {it!r} is not none or a positive number (e.g. 50)")
        out.append(v)
    return out


def _kv_dtypes(text) -> list[tuple[str, str] | None]:
    """"none,fp8,int8:head" (CLI) or a TOML list: KV cache dtypes of decode cells, each none (the cell's dtype)
    or DTYPE[:LAYOUT] (fp8 = float8_e4m3fn, e5m2, int8; layout token (default), head, tensor or page)."""
    out = []
    for it in _strs(text):
        if it.lower() in ("none", "bf16", "bfloat16", ""):
            out.append(None)
            continue
        name, _, layout = it.lower().partition(":")
        try:
            name = canonical_kv_dtype(name)
        except ValueError as e:
            raise SweepError(f"kv_dtype: {e}") from None
        if (layout or "token") not in SCALE_LAYOUTS:
            raise SweepError(f"kv_dtype: {it!r}: the scale layout must be one of {', '.join(SCALE_LAYOUTS)}")
        out.append((name, layout or "token"))
    return out


def _lengths_value(text: str) -> str:
    """A lengths value as the cells spell it: a name (``full``, ``paged64``, a request-length distribution, with a
    ``:pagedN`` after it) in lower case, ``file:PATH`` (or a file's path) keeping its path and a ``:pagedN`` after it;
    anything else as given (the sweep's check names it). A name wins over a file of that name here."""
    head, sep, tail = text.rpartition(":paged")
    path, suffix = (head, sep + tail) if sep and tail.isdigit() else (text, "")
    if path.lower() in (*LENGTHS, *DISTRIBUTIONS) or path.lower().startswith("paged"):
        return text.lower()
    if path.lower().startswith("file:"):
        return "file:" + path[5:] + suffix
    return "file:" + path + suffix if os.path.isfile(path) else text


def _none_or(convert):
    return lambda axis, text: [None if x.lower() == "none" else convert(x) for x in _strs(text)]


#: The parser of each kind of axis (``core.cell_fields.CellField.axis``): (axis name, CLI text or TOML value) -> values.
AXIS_PARSERS = {
    "ints": _ints,
    "names": _none_or(str),                  # none or a name, its case kept
    "lower_names": _none_or(str.lower),      # none or a value, in lower case
    "lengths": _none_or(_lengths_value),
    "lower": lambda axis, text: [x.lower() for x in _strs(text)],
    "caps": lambda axis, text: _caps(text),
    "bools": lambda axis, text: _causal(text, axis),
    "kv_dtypes": lambda axis, text: _kv_dtypes(text),
}


def load_toml(path) -> tuple[dict, dict]:
    """(sweep values, run options) from a TOML file with a [sweep] table and an optional [run] table."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise SweepError(f"config file {path} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise SweepError(f"config file {path} is not valid TOML: {e}") from None
    except OSError as e:
        raise SweepError(f"config file {path} cannot be read: {e}") from None
    if "sweep" not in data or not isinstance(data["sweep"], dict):
        raise SweepError(f"config file {path} has no [sweep] table")
    extra = set(data) - {"sweep", "run"}
    if extra:
        raise SweepError(f"config file {path}: unknown table(s) {', '.join(sorted(extra))}; expected [sweep] and [run]")
    run = data.get("run", {})
    bad = set(run) - {"repeats", "compile_budget", "check", "warmup", "min_time"}
    if bad:
        raise SweepError(f"config file {path}: unknown [run] key(s) {', '.join(sorted(bad))}")
    return data["sweep"], run
