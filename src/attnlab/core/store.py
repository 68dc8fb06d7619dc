"""Results store: one JSON record per line, each flushed and fsync'd as it is written.

A killed run loses at most the record being written; a torn last line is ignored on read.
Records are checked against ``attnlab.core.records``' schema when written and when read. The store is
the JSON boundary: a cell record arrives as the typed ``CellRecord`` and becomes a flat dict only here
(``append``, ``rewrite``); every line of a results file is written by this module.
"""
from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import math
import os
import tempfile
from typing import Iterable

import numpy as np

from .record_model import CellRecord
from .records import upgrade, validate


class ResultStore:
    def __init__(self, path):
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

    def append(self, record: CellRecord | dict) -> None:
        """Validate ``record`` (a ``CellRecord``, or a flat record of another kind: a lab step, a run)
        against the schema (``attnlab.core.records``), then write it durably."""
        self._write([record], "a", self.path)

    def rewrite(self, records) -> None:
        """Replace the file by ``records`` (each validated as ``append`` does), atomically: a kill leaves
        the old file or the new one, never a mix."""
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(self.path)), prefix="results.", suffix=".tmp")
        os.close(fd)
        try:
            self._write(records, "w", tmp)
            os.replace(tmp, self.path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)   # a failed write (a full disk) leaves no temporary file behind

    @staticmethod
    def _write(records, mode: str, path: str) -> None:
        """Strict JSON: a non-finite number (an exact output's margin, inf; a NaN output's error) is written null."""
        lines = [json.dumps(_finite(validate(_flat(r))), default=_jsonable, allow_nan=False) for r in records]
        with open(path, mode, encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[dict]:
        return read_jsonl(self.path)

    def write_csv(self, csv_path=None, columns: Iterable[str] | None = None) -> str:
        csv_path = csv_path or os.path.splitext(self.path)[0] + ".csv"
        write_csv(self.records(), csv_path, columns)
        return csv_path


class FolderBusy(ValueError):
    """Another process is writing the results folder."""


_HELD: dict[str, int] = {}


@contextlib.contextmanager
def one_writer(folder: str):
    """Hold ``folder`` (its ``.attnlab.lock``) for this process while it writes results there: a second process
    raises ``FolderBusy`` at once (two ``--resume`` of one folder each wrote every record). Holds nest within one
    process (the lab's steps sweep into folders it holds); the operating system frees the lock when the process ends,
    however it ends."""
    key = os.path.realpath(folder)
    if _HELD.get(key):
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, ".attnlab.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderBusy(f"{folder} is being written by another attnlab process: wait for it to end, or give "
                             f"another --out") from None
        _HELD[key] = 1
        try:
            yield
        finally:
            del _HELD[key]


def _finite(x):
    """``x`` with every non-finite float (in dicts and lists too) replaced by None."""
    if isinstance(x, (float, np.floating)):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def read_records(path) -> list[dict]:
    """The records of a results file, upgraded from older schemas and validated (``RecordError``
    names the line and the field that breaks the schema)."""
    out = []
    for i, rec in enumerate(read_jsonl(path), 1):
        out.append(validate(upgrade(rec), where=f"{os.fspath(path)}: record {i}: "))
    return out


def read_jsonl(path) -> list[dict]:
    """The JSON objects of a JSON-lines file, one per line; a torn last line (a kill mid-write) is passed over.
    Any other line that is not a JSON object raises ``ValueError`` naming the file and line: a rewrite of the
    file (``--resume``) would otherwise drop it without a word."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = [(n, line.strip()) for n, line in enumerate(f, 1) if line.strip()]
    out = []
    for i, (n, line) in enumerate(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                continue    # a line torn by a kill mid-write
            rec = None
        if not isinstance(rec, dict):
            raise ValueError(f"{os.fspath(path)}: line {n} is not a JSON record ({line[:40]!r}); only a torn "
                             f"last line is passed over")
        out.append(rec)
    return out


def write_csv(records: list[dict], path, columns: Iterable[str] | None = None) -> None:
    """Flat CSV: nested values (env, lists) are JSON-encoded into one cell."""
    records = [_flat(r) for r in records]
    cols = list(columns) if columns else _columns(records)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow({k: json.dumps(v, default=_jsonable) if isinstance(v, (dict, list, tuple)) else v for k, v in r.items()})


def _flat(record: CellRecord | dict) -> dict:
    return record.flat() if isinstance(record, CellRecord) else record


def _columns(records):
    seen: dict[str, None] = {}
    for r in records:
        for k in r:
            seen.setdefault(k, None)
    return list(seen)


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)
