"""The measured dispatch table behind ``implementation="auto"``: shape buckets, the cache file, lookup.

``attnlab tune`` measures cells with the sweep engine and writes, for each (device kind, library
versions, shape bucket), the fastest *correct* backend (records of status ``ok`` only) with its
median time and the runner-ups' (milliseconds, CUPTI kernel time on a GPU, wall clock elsewhere).
``api.select`` consults it through ``lookup``: an entry is used only when its device kind and every
version it names (jax, jaxlib, cuDNN, and the library of each backend in the entry) equal the
running ones; any other entry is *stale* and ``lookup`` says why, so auto falls back to the static
rule (``backends.AUTO_ORDER``).

This module imports no JAX (nor measure, sweep or api): the running versions are handed in.

File: JSON ``{"schema": 1, "kind": "attnlab-dispatch", "entries": [entry, ...]}``; an entry is
``{"device_kind", "versions": {name: version}, "bucket", "fields", "backend", "ms", "runner_up":
[{"backend", "ms"}, ...], "cells", "shapes", "timer", "date"}``.
Where: ``ATTNLAB_DISPATCH=off`` disables it, ``ATTNLAB_DISPATCH=/path.json`` names the file; else
``$ATTNLAB_CACHE_DIR/dispatch.json``, ``$XDG_CACHE_HOME/attnlab/dispatch.json`` or
``~/.cache/attnlab/dispatch.json``.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from typing import Callable, Iterable, Mapping

from ..core.problem import Problem
from ..core.records import time_ms
from ..kernels.decode_plan import next_pow2

SCHEMA = 1
KIND = "attnlab-dispatch"
ENV_VAR = "ATTNLAB_DISPATCH"
CACHE_VAR = "ATTNLAB_CACHE_DIR"
#: Versions every entry is keyed by, beside the libraries of the backends it names.
BASE_VERSIONS = ("jax", "jaxlib", "cudnn")
#: Sweep mode -> bucket mode: forward alone, or a training step (forward and backward).
MODES = {"fwd": "fwd", "fwd+bwd": "train", "bwd": "bwd"}

_ms = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < math.inf  # noqa: E731
_str = lambda x: isinstance(x, str)  # noqa: E731
#: What an entry must hold to be used (``load`` refuses a file with an entry that lacks one): ms finite and >= 0,
#: ``versions`` (str or None) of at least ``BASE_VERSIONS``, ``runner_up`` a list of ``{"backend": str, "ms": ms}``.
ENTRY_RULES = {"device_kind": _str, "bucket": _str, "backend": _str, "ms": _ms,
               "versions": lambda x: isinstance(x, dict) and {*BASE_VERSIONS} <= {*x}
               and all(v is None or _str(v) for v in x.values()),
               "runner_up": lambda x: isinstance(x, list) and all(isinstance(r, dict) and _str(r.get("backend"))
                                                                  and _ms(r.get("ms")) for r in x)}


class DispatchError(ValueError):
    """A dispatch file that cannot be read as one (bad JSON, other schema)."""


# --- where ----------------------------------------------------------------------------------

def enabled() -> bool:
    """False when ``ATTNLAB_DISPATCH`` is ``off`` (or 0/false/no/none)."""
    return os.environ.get(ENV_VAR, "").strip().lower() not in ("off", "0", "false", "no", "none")


def default_path() -> str:
    """The dispatch file auto reads and ``attnlab tune`` writes by default (module docstring)."""
    v = os.environ.get(ENV_VAR, "").strip()
    if v and enabled() and v.lower() not in ("on", "1", "true", "yes"):
        return os.path.expanduser(v)
    root = os.environ.get(CACHE_VAR) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "attnlab")
    return os.path.join(root, "dispatch.json")


# --- buckets --------------------------------------------------------------------------------

def window_kind(window) -> str:
    """none | left (``(left, 0)``: keys before the query only) | window (reaches both sides)."""
    if window is None:
        return "none"
    return "left" if tuple(window)[1] == 0 else "window"


def group_kind(heads: int, kv_heads: int) -> str:
    """mha (K = N), mqa (K = 1), else gqa."""
    return "mha" if heads == kv_heads else "mqa" if kv_heads == 1 else "gqa"


def bucket_fields(obj, mode: str | None = None) -> dict:
    """The shape bucket of a ``Call`` (``attnlab.core.call``), ``Problem``, ``measure.Cell`` or record dict.

    dtype, causal, window kind, mode (fwd | train | bwd), head dim H exactly, group kind
    (mha/gqa/mqa), T and S rounded up to a power of two, B·N rounded up to a power of two,
    ``lengths`` (query/key lengths given: ragged), ``extra`` (bias, mask, residual, a soft cap, segment
    ids or sinks: never tuned)."""
    get = obj.get if isinstance(obj, Mapping) else lambda k, d=None: getattr(obj, k, d)
    p = get("problem") if not isinstance(obj, Mapping) and get("problem") is not None else Problem.of(obj)
    if mode is None:
        mode = get("mode", None) or "fwd"
    mode = MODES.get(mode, mode)
    if mode not in MODES.values():
        raise ValueError(f"mode must be one of {sorted(MODES) + sorted(MODES.values())}, got {mode!r}")
    lengths = bool(get("lengths", None) or get("has_q_lengths", False) or get("has_kv_lengths", False))
    extra = [n for n, v in (("bias", get("bias_shape", None)), ("mask", get("mask_shape", None)),
                            ("residual", get("return_residual", False)), ("softcap", get("soft_cap", None)),
                            ("segments", get("has_segment_ids", False) or get("packing", None)),
                            ("sinks", get("has_sinks", False) or get("sinks", False))) if v]
    return {"dtype": p.dtype, "causal": bool(p.causal), "window": window_kind(p.window), "mode": mode,
            "H": p.head_dim, "group": group_kind(p.heads, p.kv_heads), "T": next_pow2(p.q_len),
            "S": next_pow2(p.kv_len), "BN": next_pow2(p.batch * p.heads), "lengths": lengths,
            "extra": "+".join(extra) or None}


def bucket(obj, mode: str | None = None) -> str:
    """``bucket_fields`` as one stable string: ``bfloat16 causal win:none fwd H128 mha T16384 S16384 BN16 dense``."""
    f = bucket_fields(obj, mode)
    parts = [f["dtype"], "causal" if f["causal"] else "full", f"win:{f['window']}", f["mode"], f"H{f['H']}",
             f["group"], f"T{f['T']}", f"S{f['S']}", f"BN{f['BN']}", "ragged" if f["lengths"] else "dense"]
    parts += [f["extra"]] if f["extra"] else []
    return " ".join(parts)


# --- the table ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Table:
    """The entries of one dispatch file (``path`` where it was read from)."""

    entries: tuple[dict, ...]
    path: str | None = None

    def for_bucket(self, key: str) -> list[dict]:
        return [e for e in self.entries if e.get("bucket") == key]


def _time(rec: dict) -> float | None:
    """``records.time_ms`` (kernel ms where measured, else wall ms) as a float."""
    return None if (t := time_ms(rec)) is None else float(t)


def not_dispatched(get: Callable[[str], object]) -> str | None:
    """Why a cell or record (``get(field)``: its value) keys no entry: not what a plain call of its shape runs, or
    inputs other than gaussian (they time the same kernels: one entry a shape); None where it keys one."""
    return ("devices > 1 or a strategy" if get("strategy") or (get("devices") or 1) != 1 else next((
        f for f in ("lengths", "packing", "sinks") if get(f)), None) or ("soft_cap" if get("soft_cap") is not None
        else None if (get("inputs") or "gaussian") == "gaussian" else "inputs other than gaussian"))


def build(records: Iterable[dict], library_of: Callable[[str], Iterable[str]] = lambda name: (),
          date: str | None = None) -> list[dict]:
    """Dispatch entries from sweep records: per (device kind, versions, bucket), rank the backends that are ``ok`` in
    *every* measured cell of the bucket by the geometric mean of their median times (ms) there; a backend not ok in
    one cell of the bucket is left out of it, so an entry never names a backend that failed, was unchecked or refused.
    Cells ``not_dispatched`` names and records without ``env.device_kind`` are left out. ``library_of(backend)``:
    the optional libraries it calls (import names, as in ``env.optional``)."""
    date = date or datetime.date.today().isoformat()
    groups: dict[tuple, dict] = {}
    for r in records:
        if not_dispatched(r.get):
            continue
        env = r.get("env") or {}
        if not isinstance(env.get("device_kind"), str):
            continue                      # a record that does not say where it ran keys no entry
        key = (env.get("device_kind"), json.dumps({k: env.get(k) for k in BASE_VERSIONS}, sort_keys=True), bucket(r))
        g = groups.setdefault(key, {"env": env, "cells": {}, "fields": bucket_fields(r)})
        g["cells"].setdefault(Problem.of(r).label, {})[r["backend"]] = r
    out = []
    for (kind, _, bkey), g in groups.items():
        cells = g["cells"]
        ok = lambda rec: rec is not None and rec.get("status") == "ok" and _time(rec) and _time(rec) > 0  # noqa: E731
        names = sorted({b for by in cells.values() for b in by})
        good = [b for b in names if all(ok(by.get(b)) for by in cells.values())]
        if not good:
            continue
        ranked = sorted((math.exp(sum(math.log(_time(by[b])) for by in cells.values()) / len(cells)), b) for b in good)
        env = g["env"]
        versions = {k: env.get(k) for k in BASE_VERSIONS}
        optional = env.get("optional") or {}
        for _, b in ranked:
            for lib in library_of(b):
                versions[lib] = optional.get(lib)
        timers = {by[b].get("timer") for by in cells.values() for b in good}
        out.append({"device_kind": kind, "versions": versions, "bucket": bkey, "fields": g["fields"],
                    "backend": ranked[0][1], "ms": ranked[0][0],
                    "runner_up": [{"backend": b, "ms": t} for t, b in ranked[1:]],
                    "cells": len(cells), "shapes": sorted(cells), "timer": "/".join(sorted(t or "?" for t in timers)),
                    "date": date})
    return out


def merge(old: Iterable[dict], new: Iterable[dict]) -> list[dict]:
    """``old`` entries with those of ``new`` replacing any of the same (device kind, jax/jaxlib/cuDNN versions,
    bucket): a newer run replaces an older one even when it measured other libraries' backends (whose versions too)."""
    ident = lambda e: (e.get("device_kind"),  # noqa: E731
                       json.dumps({k: (e.get("versions") or {}).get(k) for k in BASE_VERSIONS}, sort_keys=True),
                       e.get("bucket"))
    fresh = {ident(e): e for e in new}
    return [e for e in old if ident(e) not in fresh] + list(fresh.values())


def save(entries: Iterable[dict], path: str | None = None) -> str:
    """Write ``entries`` (atomically) to ``path`` (default ``default_path()``); returns the path."""
    path = path or default_path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"schema": SCHEMA, "kind": KIND, "entries": list(entries)}, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path


def load(path: str | None = None) -> Table:
    """The table at ``path`` (default ``default_path()``; no file: empty); else ``DispatchError`` (``ENTRY_RULES``)."""
    path = path or default_path()
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return Table((), path)
    except (OSError, ValueError) as e:
        raise DispatchError(f"{path}: not a readable dispatch table ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or data.get("schema") != SCHEMA:
        raise DispatchError(f"{path}: not an attnlab dispatch table of schema {SCHEMA}")
    entries = data.get("entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise DispatchError(f"{path}: 'entries' is not a list of objects")
    for i, e in enumerate(entries):
        if bad := [k for k, ok in ENTRY_RULES.items() if not ok(e.get(k))]:
            raise DispatchError(f"{path}: entry {i}: field(s) {', '.join(bad)} missing or of the wrong type")
    return Table(tuple(entries), path)


_LOADED: dict[str, tuple[tuple, Table]] = {}


def load_cached(path: str | None = None) -> Table:
    """``load``, re-read only when the file's mtime or size changes (auto consults it on every call). No
    file is an empty table, but the absence of one ``ATTNLAB_DISPATCH`` names is a ``DispatchError``."""
    path = path or default_path()
    try:
        st = os.stat(path)
        stamp = (st.st_mtime_ns, st.st_size)
    except OSError as e:
        if os.path.expanduser(os.environ.get(ENV_VAR, "").strip()) == path:   # named by hand: reported, as a corrupt one
            raise DispatchError(f"{path}: no dispatch table there ({e.strerror}; named by {ENV_VAR}; `attnlab tune "
                                f"--out {path}` writes one, {ENV_VAR}=off turns it off)") from None
        return Table((), path)
    hit = _LOADED.get(path)
    if hit and hit[0] == stamp:
        return hit[1]
    t = load(path)
    _LOADED[path] = (stamp, t)
    return t


# --- lookup ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Lookup:
    """What the table says for one bucket: an ``entry`` to use, or None with ``reason`` why not."""

    entry: dict | None
    reason: str
    path: str | None = None


def stale_reason(entry: dict, device_kind: str | None, versions: Callable[[str], str | None]) -> str | None:
    """Why ``entry`` does not hold here (other device kind, any version differing or not named), or None.
    ``versions(name)`` is the running version of jax, jaxlib, cudnn or a backend library (None: absent)."""
    if entry.get("device_kind") != device_kind:
        return f"dispatch entry tuned on {entry.get('device_kind')}, running on {device_kind}"
    for name, v in {**dict.fromkeys(BASE_VERSIONS, "?"), **(entry.get("versions") or {})}.items():
        now = versions(name)
        if now != v:
            return f"dispatch entry tuned with {name} {v}, running {name} {now if now is not None else '(absent)'}"
    return None


def lookup(table: Table, key: str, device_kind: str | None, versions: Callable[[str], str | None]) -> Lookup:
    """The entry of bucket ``key`` that holds on this device and these versions (``stale_reason``), or none with
    the reason: no entry for the bucket, or why the bucket's entries are stale."""
    name = os.path.basename(table.path) if table.path else "dispatch table"
    cands = table.for_bucket(key)
    if not cands:
        return Lookup(None, f"no dispatch entry for this bucket in {name}", table.path)
    reasons = []
    for e in reversed(cands):   # the newest first: ``merge`` appends what a run measured
        why = stale_reason(e, device_kind, versions)
        if why is None:
            return Lookup(e, "measured", table.path)
        reasons.append(why)
    return Lookup(None, reasons[0], table.path)


def describe(entry: dict, path: str | None = None) -> str:
    """``measured 1.58 ms vs cudnn 1.72 ms, tuned 2026-12-03 (dispatch.json)``."""
    ru = entry.get("runner_up") or []
    vs = f" vs {ru[0]['backend']} {ru[0]['ms']:.3g} ms" if ru else " (the only correct backend measured)"
    where = f" ({os.path.basename(path)})" if path else ""
    return f"measured {entry['ms']:.3g} ms{vs}, tuned {entry.get('date', '?')}{where}"
