"""The pieces a lab step returns: a section of the report with text, tables and plots."""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclasses.dataclass
class Section:
    """One step of the lab. ``status``: "ok", "skipped" (with ``reason``) or "failed"."""

    id: str
    title: str
    status: str = "ok"
    reason: str | None = None
    paragraphs: list[str] = dataclasses.field(default_factory=list)
    tables: list[Table] = dataclasses.field(default_factory=list)
    plots: list[str] = dataclasses.field(default_factory=list)   # paths of PNG files
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)  # headline values, also stored

    def record(self) -> dict:
        return {"kind": "lab_step", "step": self.id, "title": self.title, "status": self.status,
                "reason": self.reason, **self.facts}


@dataclasses.dataclass
class LabConfig:
    """Sizes the lab runs at; ``full`` on a GPU, scaled down on a CPU."""

    batch: int = 4
    q_len: int = 128
    heads: int = 8
    head_dim: int = 64
    quick: bool = False
    gpu: bool = False
