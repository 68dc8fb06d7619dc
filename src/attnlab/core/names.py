"""Names a user types: dtype short names, and "did you mean" for a name that is not known.

No JAX, no NumPy: every layer (the ``Problem``, the sweep files, the backend registry, the CLI) reads
names through these helpers, so ``bf16`` means ``bfloat16`` wherever a dtype is given and an unknown
backend, preset or step id gets the closest known one instead of a list of every name.
``lazy_getattr`` serves a package's public names from its submodules on first use.
"""
from __future__ import annotations

import difflib
import importlib
import sys

#: The floating dtypes attention takes, by their NumPy names.
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
#: Short names (any case) -> the NumPy name. ``f16`` is float16 here, not NumPy's 16-byte float128.
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "f16": "float16", "half": "float16",
                 "fp32": "float32", "f32": "float32", "fp64": "float64", "f64": "float64"}


def canonical_dtype(name):
    """``bf16`` -> ``bfloat16``, ``Float32`` -> ``float32``; any other value (float8 names, a NumPy
    dtype object) is returned unchanged, to be judged by whoever reads it."""
    if not isinstance(name, str):
        return name
    low = name.strip().lower()
    if low in DTYPE_ALIASES:
        return DTYPE_ALIASES[low]
    return low if low in FLOAT_DTYPES else name


def dtype_choices() -> str:
    """"float16, bfloat16, float32, float64 (or bf16, fp16, ...)": what a dtype may be called."""
    return f"{', '.join(FLOAT_DTYPES)} (or {', '.join(DTYPE_ALIASES)})"


def match(name: str, choices) -> str | None:
    """The choice ``name`` means: itself, or the one choice equal to it ignoring case (``cuDNN`` ->
    ``cudnn``); None when there is none."""
    choices = list(choices)
    if name in choices:
        return name
    folded = [c for c in choices if c.casefold() == str(name).casefold()]
    return folded[0] if len(folded) == 1 else None


def closest(name: str, choices) -> str | None:
    """The known name closest to a mistyped one (``xlaa`` -> ``xla``; difflib's ratio >= 0.6), or None."""
    by_folded = {c.casefold(): c for c in choices}
    found = difflib.get_close_matches(str(name).casefold(), list(by_folded), n=1, cutoff=0.6)
    return by_folded[found[0]] if found else None


def unknown(what: str, name, choices, *, listed_by: str | None = None, max_listed: int = 12) -> str:
    """The message for an unknown name: ``unknown backend 'xlaa'; did you mean 'xla'?``. Without a close
    name the known ones are listed, or, when more than ``max_listed``, where to find them (``listed_by``)."""
    choices = list(choices)
    guess = closest(name, choices)
    if guess is not None:
        return f"unknown {what} {name!r}; did you mean {guess!r}?"
    if listed_by and len(choices) > max_listed:
        return f"unknown {what} {name!r}; {listed_by} lists the known ones"
    return f"unknown {what} {name!r}; known: {', '.join(choices)}"


def lazy_getattr(package: str, table: dict[str, str]):
    """A module ``__getattr__`` for ``package`` that serves ``table``'s names (name -> submodule, relative
    to ``package``) on first use and keeps them in the package, so importing it imports none of them."""
    def __getattr__(name: str):
        if name in table:
            value = getattr(importlib.import_module(table[name], package), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__all__ = ["FLOAT_DTYPES", "DTYPE_ALIASES", "canonical_dtype", "dtype_choices", "match", "closest", "unknown",
           "lazy_getattr"]
