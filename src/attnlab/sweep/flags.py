"""A bench's flags and its sweep.toml, merged: contradictions refused, a flag replacing the file's value.

``attnlab bench`` gives ``merge`` the flags it was given (axis name -> the flag's text) and its
``--config`` file; the result goes to ``attnlab.sweep.build``. Errors are ``SweepError``.
"""
from __future__ import annotations

import json
import math

from .spec import SweepError, load_toml

#: Flags that set the same axis two ways: refused together, and a flag replaces the config file's other way.
CONTRADICTIONS = (("seq", "q_len"), ("seq", "kv_len"), ("tokens", "batch"))


def flag_name(name: str) -> str:
    """The command-line flag of an axis: q_len -> --q-len."""
    return "--" + name.replace("_", "-")


def check_contradictions(given: dict) -> None:
    """Refuse two flags that set the same axis two ways (``CONTRADICTIONS``)."""
    for a, b in CONTRADICTIONS:
        if a in given and b in given:
            raise SweepError(f"{flag_name(a)} and {flag_name(b)} contradict each other: {flag_name(a)} sets "
                             f"{'q_len = kv_len' if a == 'seq' else 'batch = tokens // q_len'}; give one of them")


#: A file key that is another spelling of a flag's axis (``backend = [...]`` for ``--backends``).
SPELLINGS = {"backends": ("backend",)}


def merge(config: str | None, given: dict, name: str | None = None) -> tuple[dict, dict, list[str]]:
    """(sweep values for ``build``, the file's [run] options, notes) from the file and the flags: a flag
    replaces the file's value of its axis (``--seq 64`` the file's ``seq = [...]``), and the other way of
    setting it (--seq the file's q_len and kv_len, --tokens its batch, and the other way round), with a
    note saying so for each value it replaces."""
    values, run_opts = {}, {}
    notes = []
    if config:
        values, run_opts = load_toml(config)
    for k, v in given.items():
        replaced = [k, *SPELLINGS.get(k, ())]
        for a, b in CONTRADICTIONS:
            replaced += [b] if k == a else [a] if k == b else []
        for key in replaced:
            old = values.pop(key, None)
            if old is not None:
                notes.append(f"{flag_name(k)} replaces {key} = {_toml_text(old)} from {config} with {v}")
        values[k] = v
    if name:
        if values.get("name") is not None:
            notes.append(f"--name replaces name = {_toml_text(values['name'])} from {config} with {name}")
        values["name"] = name
    return values, run_opts, notes


def _toml_text(value) -> str:
    """A file's value as the file spells it: [32, 64], "both", true."""
    return json.dumps(value) if not isinstance(value, str) else f'"{value}"'


def seconds(name: str, value, *, zero: bool = False) -> float:
    """``value`` as seconds: a finite number > 0 (>= 0 with ``zero``), else ``SweepError`` naming ``name``."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and \
        (value >= 0 if zero else value > 0)
    if not ok:
        raise SweepError(f"{name}: {value!r} must be a finite number of seconds {'>= 0' if zero else '> 0'}")
    return float(value)


def run_options(run_opts: dict, *, repeats=None, compile_budget=None, min_time=None) -> tuple:
    """(repeats, compile budget s, min time s): a flag, else the file's [run] value, else the default; checked."""
    reps = repeats if repeats is not None else run_opts.get("repeats")
    if reps is not None and (not isinstance(reps, int) or reps < 1):
        raise SweepError(f"repeats: {reps!r} is not a positive integer")
    budget = seconds("compile budget", compile_budget if compile_budget is not None
                     else run_opts.get("compile_budget", 300.0))
    mt = seconds("min time", min_time if min_time is not None else run_opts.get("min_time", 0.1), zero=True)
    return reps, budget, mt


def warmup_of(run_opts: dict, default: int = 2) -> int:
    """The file's [run] ``warmup`` (untimed calls before the timed ones), else ``default``; checked."""
    w = run_opts.get("warmup", default)
    if isinstance(w, bool) or not isinstance(w, int) or w < 0:
        raise SweepError(f"warmup: {w!r} is not a non-negative integer")
    return w
