"""Records -> auto's dispatch table (``attnlab.api.dispatch``): what ``attnlab tune`` and benchmarks/auto/goal.py write."""
from __future__ import annotations

from .. import backends
from ..api import dispatch
from ..api.dot_product import auto_ineligible
from ..measure.cell_type import record_key
from .parse import SweepError


def library_of(name: str) -> list[str]:
    """The optional libraries (import names) backend ``name`` calls: the versions its entry is keyed by."""
    try:
        return list(backends.get(name).libraries())
    except ValueError:
        return []


def existing_entries(out: str, replace: bool = False) -> list[dict]:
    """The entries already in ``out`` that a tune merges its own with (none with ``replace``): an absent file
    has none; one that is not a dispatch table is a ``SweepError`` naming it (``attnlab tune`` asks before
    it measures, so a corrupt file never costs a sweep)."""
    if replace:
        return []
    try:
        return list(dispatch.load(out).entries)
    except dispatch.DispatchError as e:
        raise SweepError(f"--out {e}; --replace overwrites it, or give another --out") from None


def finished_buckets(records, cells) -> list[dict]:
    """The ``records`` of buckets whose every cell of ``cells`` (``measure.Cell``) has a record: an interrupted
    tune ranks no bucket where a backend or a shape was never measured (its fastest might be the one missing)."""
    done = {record_key(r) for r in records}
    partial = {dispatch.bucket(c) for c in cells if c.key() not in done}
    return [r for r in records if dispatch.bucket(r) not in partial]


def write_table(records, out: str, *, replace: bool = False) -> tuple[str, list[dict]]:
    """Build entries from ``records`` (only auto-eligible backends ranked) and merge them into ``out``
    (``replace``: drop the entries already there). Returns (the path written, the new entries)."""
    def eligible(r):
        try:
            return auto_ineligible(backends.get(r["backend"])) is None
        except ValueError:
            return False

    entries = dispatch.build([r for r in records if eligible(r)], library_of)
    old = existing_entries(out, replace)
    return dispatch.save(dispatch.merge(old, entries), out), entries
