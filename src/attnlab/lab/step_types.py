"""The pieces a lab step works with and returns: its declaration (``Step``), its context, and a
section of the report. Imports no JAX, so the renderers (``attnlab.lab.render``) that build
``Section``s from records run without it; probes and plans reach JAX through ``jax_side()``."""
from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from ..core.record_model import CellRecord
from ..core.store import ResultStore

if TYPE_CHECKING:
    from ..sweep.spec import Sweep


@functools.cache
def jax_side() -> ModuleType:
    """``attnlab.lab.jax_side``: what probes and plans measure with (JAX, the API, backends, reference,
    ``Sweep``), imported on the first call. The lab's one deferred import: a step module calls this
    in its probe or plan instead of importing JAX, so rendering a step never loads JAX."""
    return importlib.import_module(".jax_side", __package__)


EMPTY = ("", "–", None)


@dataclasses.dataclass
class Table:
    """A report table. ``empty_why`` maps a column to why it can be empty on this machine: a column
    empty in every row is left out of the report, which says that reason once (``compact``).
    ``sources``: the record each row shows (None for a row that shows none), so that a column whose
    header names a record field (``render_common.FIELD_COLUMNS``) can be checked against it."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    empty_why: dict[str, str] = dataclasses.field(default_factory=dict)
    sources: list = dataclasses.field(default_factory=list)

    def compact(self) -> tuple["Table", dict[str, str]]:
        """(this table without its all-empty columns, {dropped column: why})."""
        keep = [i for i, _ in enumerate(self.columns) if not self.rows or any(r[i] not in EMPTY for r in self.rows)]
        dropped = {c: self.empty_why.get(c, "no value on this machine") for i, c in enumerate(self.columns) if i not in keep}
        return (Table(self.title, [self.columns[i] for i in keep], [[r[i] for i in keep] for r in self.rows],
                      sources=self.sources), dropped)


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
    folds: list = dataclasses.field(default_factory=list)   # [(summary, [line, ...])]: shown folded (<details>)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)  # headline values, also stored

    def record(self) -> dict:
        return {"kind": "lab_step", "step": self.id, "title": self.title, "status": self.status,
                "reason": self.reason, **self.facts}


@dataclasses.dataclass
class LabConfig:
    """Sizes the lab runs at: full on a GPU, scaled down on a CPU, smallest with ``quick``."""

    batch: int = 4
    q_len: int = 128
    heads: int = 8
    head_dim: int = 64
    quick: bool = False
    gpu: bool = False

    @property
    def perf_dtype(self) -> str:
        """The dtype the performance steps use: bf16 on a GPU (where the fast paths are), f32 on a CPU."""
        return "bfloat16" if self.gpu else "float32"

    @classmethod
    def for_machine(cls, quick: bool, gpu: bool) -> "LabConfig":
        """Quick (CPU or GPU): every step at the smallest shapes, few distinct shapes (each new shape
        costs compiles of the inputs, the path and both references): a smoke test of every step."""
        if quick:
            return cls(batch=2, q_len=64, heads=4, head_dim=32, quick=True, gpu=gpu)
        return cls(quick=quick, gpu=gpu)

    @property
    def seq_lens(self) -> list[int]:
        """T = S of the sequence sweep: the default T among them (the timing step's cells reappear)."""
        if self.quick:
            return [self.q_len, 4 * self.q_len] if self.gpu else [self.q_len // 2, self.q_len]
        return [128, 512, 2048, 8192] if self.gpu else [32, 64, 128, 256]

    @property
    def batches(self) -> list[int]:
        """B of the batch sweep: the default B among them (measured by the sequence sweep already)."""
        return list(dict.fromkeys([1, self.batch] if self.quick else [1, self.batch, 16]))

    @property
    def batch_sweep_len(self) -> int:
        """T = S of the batch sweep: one of the sequence sweep's (its default-B cell is shared)."""
        return 512 if self.gpu and not self.quick else self.q_len

    @property
    def long_len(self) -> int:
        """T = S of the GQA and head-dim steps: one of the sequence sweep's (the default H is shared)."""
        if self.quick:
            return self.q_len
        return 2048 if self.gpu else self.q_len

    @property
    def head_dims(self) -> tuple[int, ...]:
        return (32, 64, 128, 256, 512)

    @property
    def timed_head_dims(self) -> tuple[int, ...]:
        """Head dims XLA times in the head-dim step: the default one (shared with the sequence sweep)
        and, beyond quick, 512 (which cuDNN refuses); every head dim still gets cuDNN's verdict."""
        return (self.head_dim,) if self.quick else (self.head_dim, 512)


@dataclasses.dataclass
class LabContext:
    cfg: LabConfig
    out_dir: str
    store: ResultStore
    env: dict                  # the short env stored with each record
    env_full: dict = dataclasses.field(default_factory=dict)
    label: str | None = None
    records: list = dataclasses.field(default_factory=list)  # every record this run stored, in order
    resume: bool = False       # going on from a stopped run: its sweeps folder (sweeps_dir) was kept
    measured: dict = dataclasses.field(default_factory=dict)  # cell key -> record measured by this invocation
    resumed: dict = dataclasses.field(default_factory=dict)   # cell key -> None: taken from the stopped run (``resume``)
    on_cell: "Callable[[str, int, int], None] | None" = None   # (sweep name, index, total) after each cell

    @property
    def sweeps_dir(self) -> str:
        """The sweep engine's folder: every timed cell of the run, measured once (results.jsonl there)."""
        return os.path.join(self.out_dir, "sweeps")

    def append(self, rec: CellRecord | dict) -> CellRecord | dict:
        """Store ``rec`` in results.jsonl (validated, durably) and keep it for the renderers."""
        self.store.append(rec)
        self.records.append(rec)
        return rec

    @property
    def plots_dir(self) -> str:
        d = os.path.join(self.out_dir, "plots")
        os.makedirs(d, exist_ok=True)
        return d


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the lab, as data and functions that each do one thing:

    * ``sweeps(cfg) -> [Sweep]``: the cells it times, as declarations (run by the sweep engine,
      which records each cell as it finishes and, with ``resume``, skips the recorded ones). Each
      sweep's ``name`` is the ``step`` tag its cell records carry in results.jsonl.
    * ``probe(ctx) -> dict``: facts that are not timed cells (what ran, verdicts, compiled memory),
      stored in the step's ``lab_step`` record under ``probe``.
    * ``render(records, cfg, plots_dir) -> Section``: pure (no JAX, no measuring): the section from
      the run's records (all of them; it picks its own by ``step``) and the config.
    * ``cells_note(cfg) -> str``: one sentence for the step's text: which cells it times, and why those.

    Each step is one module of ``attnlab.lab.steps`` holding its ``STEP``; ``title`` is its heading
    in the report (a renderer may add the shape it ran at).
    """

    id: str
    title: str
    render: Callable[[list, LabConfig, "str | None"], Section]
    sweeps: "Callable[[LabConfig], list[Sweep]] | None" = None
    probe: Callable[[LabContext], dict] | None = None
    cells_note: Callable[[LabConfig], str] | None = None
