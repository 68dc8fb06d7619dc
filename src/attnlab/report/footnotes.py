"""Reasons numbered once each, for the tables that show a cell that was not timed (bench, compare, advise)."""
from __future__ import annotations


class Footnotes:
    """Reasons numbered once each: ``mark(backend, status, reason)`` -> "unsupported (1)". A footnote is
    the text printed ("cudnn: needs a GPU"), so a reason given with and without its backend's name, or
    with other spacing, is one footnote."""

    def __init__(self):
        self.reasons: dict[str, int] = {}

    @staticmethod
    def text(backend: str, reason: str) -> str:
        named = reason if reason.startswith(f"{backend}:") else f"{backend}: {reason}"
        return " ".join(named.split())

    def mark(self, backend: str, status: str, reason: str | None) -> str:
        if not reason:
            return status
        n = self.reasons.setdefault(self.text(backend, reason), len(self.reasons) + 1)
        return f"{status} ({n})"

    def lines(self) -> list[str]:
        """The footnotes to print under the table: "(1) cudnn: needs a GPU", in their numbers' order."""
        return [f"({n}) {named}" for named, n in self.reasons.items()]
