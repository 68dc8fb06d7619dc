"""``attnlab run``: the codelab's steps and their report.

The terminal shows the progress bar, one line per step as it ends and the cost summary; the logs of
XLA, absl, TransformerEngine and tokamax go to ``OUT/run.log``. Like ``bench``, a folder that holds
results is refused without ``--resume`` or ``--overwrite``, and Ctrl-C says what finished and how
to go on.
"""
from __future__ import annotations

import os
import sys
import threading

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..core.names import match, unknown
from ..core.records import cost_summary
from ..core.store import FolderBusy, one_writer, read_jsonl
from .. import lab
from ..lab import quiet
from ..lab.run_record import LabInterrupted, held_results, not_a_run, resume_command
from ._app import _fail, console, main, writable_folder, writes_to


class StepsOption(click.Option):
    """``--sections``, whose help lists the lab's step ids (``attnlab.lab.steps.STEPS``), read when help is shown:
    the steps import matplotlib, which every other command line would pay for at start (``lab.STEPS`` is
    loaded on first use, by the package's ``__getattr__``)."""

    def get_help_record(self, ctx):
        self.help = "Comma-separated step ids to run (default: all): " + ", ".join(lab.STEPS) + "."
        return super().get_help_record(ctx)


def step_ids(text: str, steps) -> list[str]:
    """The step ids of ``--sections``, any case (``GQA`` is ``gqa``); an unknown one is refused naming
    the closest id ("did you mean 'jax_nn'?")."""
    out = []
    for s in (p.strip() for p in text.split(",")):
        if s:
            found = match(s, steps)
            if found is None:
                raise click.BadParameter(unknown("step id", s, steps) + " (`attnlab run --help` lists them)",
                                         param_hint="--sections")
            out.append(found)
    if not out:
        raise click.BadParameter(f"{text!r} names no step id (leave --sections out to run every step)",
                                 param_hint="--sections")
    return out

COLOURS = {"ok": "green", "skipped": "yellow", "failed": "red"}


@main.command()
@click.option("--out", "out_dir", default="attnlab-out", show_default=True, type=click.Path(file_okay=False),
              help="Folder for report.html, results.jsonl, results.csv, plots/ and run.log.")
@click.option("--label", default=None, help="A name for this run, shown in the report.")
@click.option("--quick", is_flag=True, help="Smallest sizes: a smoke test of every step.")
@click.option("--sections", cls=StepsOption, default=None, help="Comma-separated step ids to run (default: all).")
@click.option("--resume", is_flag=True, help="Go on with a stopped run in --out: cells measured there are not measured again.")
@click.option("--overwrite", is_flag=True, help="Erase the results in --out and start afresh (without it, or --resume, "
                                                "a folder holding results is refused).")
def run(out_dir, label, quick, sections, resume, overwrite):
    """Run the codelab's steps and write a report."""
    quiet.prepare_environment()   # before JAX loads XLA
    if resume and overwrite:
        _fail("--resume and --overwrite contradict each other: give one of them")
    try:
        held, why = (0 if overwrite else held_results(out_dir)), resume and not_a_run(out_dir)
    except (OSError, ValueError) as e:
        _fail(f"cannot go on with {out_dir}: {e}")
    if held and not (resume or overwrite):
        _fail(f"{out_dir} already holds {held} result(s) of an earlier run: give --resume to go on with it, "
              f"or --overwrite to erase them and start afresh")
    if why:
        _fail(why)
    chosen = step_ids(sections, lab.STEPS) if sections is not None else None   # lab.STEPS, lab.run_lab: loaded here, on first use
    writable_folder(out_dir)

    log = os.path.join(out_dir, "run.log")
    try:
        # the folder held before the log is opened; an error writing it reported after the log lets the console go
        with writes_to(out_dir), one_writer(out_dir), Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                                               MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                                                               transient=True) as prog, \
                quiet.logs_to(log, append=resume) as log_file:
            task = prog.add_task("attnlab run", total=len(chosen or lab.STEPS))

            step = {"id": ""}

            def before(sid, i, n):
                step["id"] = sid
                prog.update(task, completed=i, description=f"step {sid}")
                quiet.stamp(log_file, f"step {sid} ({i + 1} of {n}) starts")

            def cell(sweep, i, n):
                prog.update(task, description=f"step {step['id']} · {sweep} cell {i}/{n}")
                quiet.stamp(log_file, f"step {step['id']}: {sweep} cell {i} of {n}")

            def after(sec, i, n):
                prog.update(task, completed=i + 1)
                reason = f" — {sec.reason}" if sec.reason else ""
                line = f"{sec.status:7} {sec.title} ({sec.facts.get('seconds', 0):.1f} s){reason}"
                quiet.stamp(log_file, f"step {sec.id}: {line}")
                prog.console.print(f"[{COLOURS.get(sec.status, 'white')}]{sec.status:7}[/] {sec.title} "
                                   f"({sec.facts.get('seconds', 0):.1f} s){escape(reason)}", highlight=False, soft_wrap=True)

            done = lab.run_lab(out_dir, label=label, quick=quick, sections=chosen, progress=before, resume=resume,
                               overwrite=overwrite, on_step=after, on_cell=cell)
    except FolderBusy as e:
        _fail(str(e))
    except LabInterrupted as e:
        finished = ", ".join(e.finished) or "none"
        quiet.stamp(log, f"stopped in step {e.stopped_in} after {len(e.finished)} of {e.total} steps (Ctrl-C)")
        console.print(escape(f"\nstopped in step {e.stopped_in} after {len(e.finished)} of {e.total} steps "
                      f"(finished: {finished}); {e.cells} cell(s) measured are kept in {out_dir}/sweeps.\n"
                      f"Go on with: {resume_command(out_dir, quick=quick, sections=chosen, label=label)}"),
                      highlight=False, soft_wrap=True)
        _exit_interrupted()
    run_rec = next((r for r in reversed(read_jsonl(os.path.join(out_dir, "results.jsonl"))) if r.get("kind") == "run"), {})
    n_resumed = run_rec.get("cells_resumed", 0) if resume else 0
    if n_resumed and not run_rec.get("cells"):   # measured nothing: no "N cells in X s" for cells of the stopped run
        cost = cost_summary([], resumed=n_resumed, resumed_from=f"{out_dir}/sweeps (the stopped run)")
    else:
        cost = (run_rec.get("cost") or cost_summary([])) + (f"; {n_resumed} resumed from {out_dir}/sweeps (the "
                                                             f"stopped run)" if n_resumed else "")
    summary = f"{run_rec.get('steps_ok', 0)} of {len(done)} steps ok in {run_rec.get('wall_s', 0):.1f} s → {out_dir}/report.html"
    for line in (cost, summary):
        quiet.stamp(log, line)
    console.print(escape(cost), highlight=False, soft_wrap=True)
    console.print(escape(f"{summary} (log: {log})"), highlight=False, soft_wrap=True)
    if any(s.status == "failed" for s in done):
        sys.exit(1)



def _exit_interrupted():
    """Exit 130 after Ctrl-C. A compile abandoned in a worker thread cannot be joined: the process
    then ends without tearing down the interpreter (whose thread teardown would abort in XLA's C++);
    every record is already on disk (fsync'd)."""
    if any(t is not threading.main_thread() and t.is_alive() and not t.daemon for t in threading.enumerate()) \
            or threading.active_count() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(130)
