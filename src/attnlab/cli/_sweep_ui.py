"""What bench, advise and tune share around a sweep: the estimate before it, ``--cell-budget``, the
phase spinner, the cost line after it, and the exit after Ctrl-C."""
from __future__ import annotations

import contextlib
import os
import statistics
import sys

import click
from rich.markup import escape

from ..core import device
from ..core.records import cost_summary
from ..core.store import read_records
from ..measure import calibration
from ..measure.cell import record_key
from ..measure.estimate import estimate_sweep, over_budget
from ..sweep.engine import remeasured
from ..sweep.flags import seconds
from ..sweep.spec import SweepError
from ._app import _fail, console

#: ``--cell-budget``'s default, seconds, by platform: a cell estimated above it is recorded over_budget.
CELL_BUDGET_S = {"cpu": 120.0, "gpu": 300.0}

cell_budget_option = click.option(
    "--cell-budget", "cell_budget_s", type=float, default=None,
    help="Seconds one cell may be estimated to take (compile, check and timing, from its FLOPs and bytes and this "
         "device's ceilings) before it is recorded over_budget instead of run (default 120 on a CPU, 300 on a GPU).")


def cell_budget(value: float | None) -> float:
    """The flag's value (checked), else the device's default."""
    if value is None:
        return CELL_BUDGET_S.get(device.current().platform, CELL_BUDGET_S["gpu"])
    try:
        return seconds("--cell-budget", value)
    except SweepError as e:
        _fail(str(e))


def print_estimate(cells, opts, resume_from: str | None = None) -> None:
    """One line before the sweep: the cell count, the estimated time and memory per cell here (what
    is compiled once per problem counted once, unavailable backends at ~0 s: ``estimate_sweep``),
    what the compile seconds come from, and how many cells are over the cell budget (recorded
    over_budget, not run). ``resume_from``: the folder whose results.jsonl the sweep resumes; the
    cells recorded there are counted apart, not estimated (but for those it measures again: ``remeasured``)."""
    path = os.path.join(resume_from, "results.jsonl") if resume_from else None
    try:
        old = {record_key(r) for r in read_records(path) if not remeasured(r, opts)} \
            if path and os.path.exists(path) else set()
    except (OSError, ValueError):   # the sweep itself reports a file it cannot read
        old = set()
    if old:
        n_all, cells = len(cells), [c for c in cells if c.key() not in old]
        if n_all > len(cells):
            console.print(f"{n_all - len(cells)} of {n_all} cells already recorded in {escape(path)}: resumed, not measured "
                          f"again", highlight=False, soft_wrap=True)
    if not cells:
        return
    info = device.current()
    ests = list(zip(estimate_sweep(cells, opts, info), cells))
    secs = [e.seconds for e, _ in ests]
    big, big_cell = max(ests, key=lambda ec: ec[0].seconds)
    over = sum(e.seconds > 0 and over_budget(c, opts, info)[1] is not None for e, c in ests)   # as measure_cell decides
    cal = calibration.current(info)
    text = (f"{len(cells)} cells on {info.kind or info.platform}: estimated ~{statistics.median(secs):.2g} s a cell "
            f"(median), ~{sum(secs):.3g} s in all, up to ~{max(e.bytes for e, _ in ests) / 2**20:.4g} MiB; "
            f"largest: {big_cell.backend} {big_cell.config_label} {big.text()}; compiles ~{cal.compile_s:.2g} s, "
            f"inputs and references ~{cal.problem_s:.2g} s a problem ({cal.source})")
    if cal.check_x < 1:
        text += f"; the check's arithmetic x{cal.check_x:.2g} of its estimate, as measured"
    text = escape(text)     # a label's lengths file may hold brackets
    if over:
        text += f"; [yellow]{over} cell(s) over the cell budget of {opts.cell_budget_s:g} s: recorded over_budget, not run[/]"
    console.print(text, highlight=False, soft_wrap=True)


def cost_line(records, resumed_cells=(), out_dir: str | None = None) -> None:
    """The cost line of the cells measured now: ``records`` less those of ``resumed_cells`` (the cells
    ``run_sweep`` found already recorded in ``out_dir``: counted as resumed, their seconds not summed)."""
    old = {c.key() for c in resumed_cells}
    now = [r for r in records if record_key(r) not in old]
    src = os.path.join(out_dir, "results.jsonl") if out_dir else None
    console.print(escape(cost_summary(now, resumed=len(records) - len(now), resumed_from=src)), highlight=False,
                  soft_wrap=True)


def phase_spinner():
    """A spinner showing the running cell and its phase (inputs, compile, check, timing): a context
    manager giving ``on_phase(cell, phase)`` for ``run_sweep``. Quiet where the console is no terminal."""
    @contextlib.contextmanager
    def spinner():
        if not console.is_terminal:
            yield None
            return
        with console.status("") as status:
            yield lambda cell, phase: status.update(f"{cell.backend} {cell.config_label} · {phase}")

    return spinner()


def exit_after_interrupt(abandoned: bool, code: int = 130):
    """Exit after Ctrl-C. A cell's worker thread or a compile ahead may still be inside XLA
    (``SweepInterrupted.abandoned``): the process's exit (``_app.leave``) does not tear the
    interpreter down while one runs."""
    sys.exit(code)
