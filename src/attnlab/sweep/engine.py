"""Run a sweep: measure each cell, append its record as it finishes, resume where a run stopped."""
from __future__ import annotations

import os
import time
from typing import Callable

from ..measure import env as envmod
from ..api import sharded  # noqa: F401  (registers the batch / heads / ring strategies: attnlab.core.strategies)
from concurrent.futures import wait

from ..core import device
from ..measure import ahead as ahead_compile
from ..measure import calibration, estimate, prefetch, threads
from ..measure.cell import IDENTITY, Cell, Options, measure_cell, record_key
from ..core.record_model import CellRecord, csv_columns
from ..core.records import config_label, is_cell, time_ms  # noqa: F401  (config_label, time_ms re-exported)
from ..core.store import FolderBusy, ResultStore, one_writer, read_jsonl, read_records, write_csv
from .spec import Sweep, SweepError
from .worker import Abandoned, call_interruptibly

#: The record's identity (the Cell's fields, derived from the dataclasses), then what was measured.
#: The CSV columns, derived from the typed record (``attnlab.core.record_model.csv_columns``).
CSV_COLUMNS = csv_columns(IDENTITY)
#: The check's reference programs of this many coming cells are compiled in the background
#: (``attnlab.measure.prefetch``), so the first backend of a new shape finds them ready.
PREFETCH_CELLS = 8


def remeasured(rec, opts: Options) -> bool:
    """Whether a resumed sweep measures a recorded cell again: its verdict came from the options, not the cell
    (``over_budget``: a budget this run may raise; ``unchecked``: a run with ``--no-check``, where this one checks)."""
    return rec.get("status") == "over_budget" or (rec.get("status") == "unchecked" and opts.check)


def _compact(path: str, opts: Options) -> list[CellRecord | dict]:
    """Rewrite the results file through the store (each record validated again) without torn lines,
    duplicate cells (first record of a cell in a step wins) or the cells this run measures again
    (``remeasured``); records of other kinds are kept as they are. The cell records come back typed."""
    seen, kept = set(), []
    for r in read_records(path):
        if is_cell(r):
            if remeasured(r, opts):
                continue
            k = (record_key(r), r.get("step"))
            if k in seen:
                continue
            seen.add(k)
        kept.append(CellRecord.from_flat(r) if is_cell(r) else r)
    ResultStore(path).rewrite(kept)
    return kept


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: the finished cells are in results.jsonl and results.csv (``--resume`` goes on)."""

    def __init__(self, finished: int, total: int, out_dir: str, abandoned: bool = False):
        super().__init__(f"interrupted after {finished} of {total} cells; results so far in {out_dir}")
        self.finished, self.total, self.out_dir = finished, total, out_dir
        self.abandoned = abandoned   # a background thread was left inside XLA (the CLI then leaves with os._exit)


def existing_records(out_dir: str) -> int:
    """How many records ``out_dir/results.jsonl`` holds (0 when there is none), each read and validated
    (``ValueError`` naming the line that is not a record, ``RecordError`` the field that breaks the schema)."""
    return len(read_records(os.path.join(out_dir, "results.jsonl")))


def run_sweep(sweep: Sweep, out_dir: str, *, resume: bool = False, overwrite: bool = False, options: Options | None = None,
              on_cell: Callable[[Cell, CellRecord | None, int, int], None] | None = None,
              on_phase: Callable[[Cell, str], None] | None = None) -> list[CellRecord]:
    """Measure every cell of ``sweep`` into ``out_dir/results.jsonl`` (+ .csv); returns all records (typed:
    ``attnlab.core.record_model.CellRecord``, read as flat records, ``rec["status"]``).

    Where ``out_dir`` already holds results, ``resume`` skips the cells recorded there and
    ``overwrite`` starts afresh (a cell recorded over_budget, or unchecked where this run checks, is
    measured again: ``remeasured``); with neither, ``SweepError`` is raised and nothing is touched.
    ``on_cell(cell, record_or_None_if_skipped, index, total)`` is called after each cell,
    ``on_phase(cell, phase)`` when a cell enters a phase (``attnlab.measure.phases.PHASES``).

    Each cell runs in a worker thread (``attnlab.sweep.worker``) so Ctrl-C lands within a fraction of
    a second. With ``options.compile_ahead`` the next cell compiles while this one is measured
    (``attnlab.measure.ahead``); this cell's timing waits for that compile, so it owns the device.
    On KeyboardInterrupt the CSV of the finished cells is written and ``SweepInterrupted`` raised
    (``abandoned``: a background thread is still inside XLA; ``attnlab.measure.threads``). No compile
    ahead outlives a sweep that ends: those not begun are cancelled, those under way waited for.
    """
    if resume and overwrite:
        raise SweepError("resume and overwrite contradict each other: give one of them")
    try:
        with one_writer(out_dir):
            return _sweep(sweep, out_dir, resume, overwrite, options or Options(), on_cell, on_phase)
    except FolderBusy as e:
        raise SweepError(str(e)) from None


def _sweep(sweep: Sweep, out_dir: str, resume: bool, overwrite: bool, opts: Options, on_cell,
           on_phase) -> list[CellRecord]:
    """``run_sweep``'s work, in a folder this process holds."""
    path = os.path.join(out_dir, "results.jsonl")
    done: dict[str, CellRecord] = {}
    n_old = 0 if overwrite else existing_records(out_dir)   # --overwrite erases what it cannot read too
    if n_old and not (resume or overwrite):
        raise SweepError(f"{out_dir} already holds {n_old} result(s) in results.jsonl: give --resume to skip the "
                         f"cells recorded there, or --overwrite to erase them and start afresh")
    if resume and os.path.exists(path):
        done = {record_key(r): r for r in _compact(path, opts)}
    elif os.path.exists(path):
        os.remove(path)
    store = ResultStore(path)
    env = envmod.short(envmod.collect())
    cells = sweep.cells()
    todo = [c for c in cells if c.key() not in done]
    pending: dict = {}
    if todo and opts.check and not calibration.learnt(device.current()):
        # what the first cell calibrates is scaled by it: taken with no background compile running (on a CPU the
        # references' thread, started by an earlier sweep or the lab, is held: its CPU time would count too)
        held = prefetch.hold()
        try:
            calibration.probe_s()
        finally:
            if held:
                prefetch.release()
    try:
        for i, cell in enumerate(cells):
            if cell.key() in done:
                if on_cell:
                    on_cell(cell, None, i, len(cells))
                continue
            rec = _measure(cell, todo, pending, opts, on_phase, {"sweep": sweep.name, "env": env})
            _calibrate(cell, rec, opts)
            store.append(rec)
            done[cell.key()] = rec
            if on_cell:
                on_cell(cell, rec, i, len(cells))
    except KeyboardInterrupt as e:
        ahead_compile.stop(0)   # cancel what has not begun; Ctrl-C does not wait for a compile under way
        recs = read_records(path)
        write_csv(recs, os.path.join(out_dir, "results.csv"), CSV_COLUMNS)
        on_disk = {record_key(r) for r in recs if is_cell(r)}   # with a record that Ctrl-C cut short after its write
        raise SweepInterrupted(sum(c.key() in on_disk for c in cells), len(cells), out_dir,
                               abandoned=isinstance(e, Abandoned) or bool(threads.running())) from None
    except BaseException:
        ahead_compile.stop(0)
        raise
    # a compile ahead whose cell did not use it (skipped before its compile), or one abandoned past its budget, is
    # not left inside XLA: the interpreter would abort at exit with a thread in it
    ahead_compile.stop(opts.compile_budget_s)
    threads.wait_compiles()
    records = [done[c.key()] for c in cells if c.key() in done]
    write_csv(read_records(path), os.path.join(out_dir, "results.csv"), CSV_COLUMNS)
    return records


def _calibrate(cell: Cell, rec: CellRecord, opts: Options) -> None:
    """The sweep's first cell that compiled and checked calibrates the estimate of the cells after it
    (their over_budget verdict) and of the next sweep here (``attnlab.measure.calibration``)."""
    info = device.current()
    if rec.get("compile_s") and rec.get("check_s") and not calibration.learnt(info):
        calibration.learn(rec, info, check_compute_s=estimate.check_compute_s(cell, opts, info))


def _measure(cell: Cell, todo: list[Cell], pending: dict, opts: Options, on_phase, stamp: dict) -> CellRecord:
    """measure_cell in a worker thread, with this cell's ahead compile and the next one's started; the
    record carries ``stamp`` (the sweep's fields) and the seconds it waited for the next cell's compile."""
    compiled = pending.pop(cell.key(), None)
    i = next(j for j, c in enumerate(todo) if c.key() == cell.key())
    prefetch.start(todo[i:i + PREFETCH_CELLS], opts.check, opts)
    nxt = None
    if opts.compile_ahead:
        if i + 1 < len(todo) and todo[i + 1].key() not in pending:
            nxt = ahead_compile.start(todo[i + 1], opts, after=cell)   # None: not compiled ahead (over budget, ...)
            if nxt is not None:
                pending[todo[i + 1].key()] = nxt

    stamp = dict(stamp)   # read by measure_cell when it builds the record, after the timing phase
    held = []

    def phase(name: str) -> None:
        if name == "timing":
            t0 = time.perf_counter()
            if nxt is not None:
                wait([nxt])         # the next compile must not run beside the timer, however long it takes,
            abandoned = threads.wait_compiles()   # nor one abandoned past its budget (a compile cannot be stopped)
            if nxt is not None or abandoned > 1e-3:   # part of this cell's wall seconds, spent on others' compiles
                stamp["next_compile_wait_s"] = time.perf_counter() - t0
        if name == "timing" and not held:
            held.append(prefetch.hold())     # nor, on a CPU, a reference's compile (until the cell ends)
        if on_phase:
            on_phase(cell, name)

    try:
        return call_interruptibly(lambda: measure_cell(cell, opts, on_phase=phase, compiled=compiled, stamp=stamp))
    finally:
        if any(held):
            prefetch.release()
