"""Results store: one JSON record per line, each flushed and fsync'd as it is written.

A killed run loses at most the record being written; a torn last line is ignored on read.
Records are checked against ``attnlab.core.records``' schema when written and when read.
"""
from __future__ import annotations

import csv
import json
import os
from typing import Iterable

from .records import upgrade, validate


class ResultStore:
    def __init__(self, path):
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

    def append(self, record: dict) -> None:
        """Validate ``record`` against the schema (``attnlab.core.records``), then write it durably."""
        validate(record)
        line = json.dumps(record, default=_jsonable, allow_nan=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[dict]:
        return read_jsonl(self.path)

    def write_csv(self, csv_path=None, columns: Iterable[str] | None = None) -> str:
        csv_path = csv_path or os.path.splitext(self.path)[0] + ".csv"
        write_csv(self.records(), csv_path, columns)
        return csv_path


def read_records(path) -> list[dict]:
    """The records of a results file, upgraded from older schemas and validated (``RecordError``
    names the line and the field that breaks the schema)."""
    out = []
    for i, rec in enumerate(read_jsonl(path), 1):
        out.append(validate(upgrade(rec), where=f"{os.fspath(path)}: record {i}: "))
    return out


def read_jsonl(path) -> list[dict]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a kill mid-write
    return out


def write_csv(records: list[dict], path, columns: Iterable[str] | None = None) -> None:
    """Flat CSV: nested values (env, lists) are JSON-encoded into one cell."""
    cols = list(columns) if columns else _columns(records)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow({k: json.dumps(v, default=_jsonable) if isinstance(v, (dict, list, tuple)) else v for k, v in r.items()})


def _columns(records):
    seen: dict[str, None] = {}
    for r in records:
        for k in r:
            seen.setdefault(k, None)
    return list(seen)


def _jsonable(x):
    try:
        import numpy as np

        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, np.ndarray):
            return x.tolist()
    except Exception:
        pass
    return str(x)
