"""Records -> auto's dispatch table (``attnlab.api.dispatch``): what ``attnlab tune`` and benchmarks/auto/goal.py write."""
from __future__ import annotations

import os

from .. import backends
from ..api import dispatch
from ..api.dot_product import auto_ineligible


def library_of(name: str) -> list[str]:
    """The optional libraries (import names) backend ``name`` calls: the versions its entry is keyed by."""
    try:
        return list(backends.get(name).libraries())
    except ValueError:
        return []


def write_table(records, out: str, *, replace: bool = False) -> tuple[str, list[dict]]:
    """Build entries from ``records`` (only auto-eligible backends ranked) and merge them into ``out``
    (``replace``: drop the entries already there). Returns (the path written, the new entries)."""
    def eligible(r):
        try:
            return auto_ineligible(backends.get(r["backend"])) is None
        except ValueError:
            return False

    entries = dispatch.build([r for r in records if eligible(r)], library_of)
    old = [] if replace or not os.path.exists(out) else list(dispatch.load(out).entries)
    return dispatch.save(dispatch.merge(old, entries), out), entries
