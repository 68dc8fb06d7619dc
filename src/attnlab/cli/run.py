"""``attnlab run``: the codelab's steps and their report."""
from __future__ import annotations

import sys

import click
from rich.table import Table as RichTable

from ._app import console, main


@main.command()
@click.option("--out", "out_dir", default="attnlab-out", show_default=True, type=click.Path(file_okay=False),
              help="Folder for report.html, results.jsonl, results.csv and plots/.")
@click.option("--label", default=None, help="A name for this run, shown in the report.")
@click.option("--quick", is_flag=True, help="Smallest sizes: a smoke test of every step.")
@click.option("--sections", default=None, help="Comma-separated step ids to run (default: all).")
@click.option("--resume", is_flag=True, help="Go on with a stopped run in --out: cells measured there are not measured again.")
def run(out_dir, label, quick, sections, resume):
    """Run the codelab's steps and write a report."""
    from ..lab import STEPS, run_lab

    chosen = [s.strip() for s in sections.split(",") if s.strip()] if sections else None
    if chosen:
        bad = [s for s in chosen if s not in STEPS]
        if bad:
            raise click.BadParameter(f"unknown section(s) {', '.join(bad)}; choose from {', '.join(STEPS)}", param_hint="--sections")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as prog:
        task = prog.add_task("attnlab run", total=len(chosen or STEPS))

        def progress(sid, i, n):
            prog.update(task, completed=i, description=f"step {sid}")

        done = run_lab(out_dir, label=label, quick=quick, sections=chosen, progress=progress, resume=resume)
        prog.update(task, completed=len(done), description="done")
    t = RichTable(title=f"attnlab run → {out_dir}/report.html")
    t.add_column("step")
    t.add_column("status")
    t.add_column("note", overflow="fold")
    colours = {"ok": "green", "skipped": "yellow", "failed": "red"}
    for s in done:
        t.add_row(s.title, f"[{colours.get(s.status, 'white')}]{s.status}[/]", s.reason or "")
    console.print(t)
    if any(s.status == "failed" for s in done):
        sys.exit(1)
