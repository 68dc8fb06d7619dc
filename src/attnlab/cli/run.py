"""``attnlab run``: the codelab's steps and their report."""
from __future__ import annotations

import sys

import click
from rich.table import Table as RichTable

from ._app import console, main, writable_folder, writes_to

#: The lab's step ids, in order (``attnlab.lab.STEPS``; a test keeps the two equal): listed by ``--help``
#: without importing JAX.
STEP_IDS = ("environment", "qkv", "naive", "jax_nn", "cudnn", "causal", "timing", "sweeps", "gqa", "te_fp8", "next",
            "decode")


def step_ids(text: str, steps) -> list[str]:
    """The step ids of ``--sections``, any case (``GQA`` is ``gqa``); an unknown one is refused naming
    the closest id ("did you mean 'jax_nn'?")."""
    from ..names import match, unknown

    out = []
    for s in (p.strip() for p in text.split(",")):
        if s:
            found = match(s, steps)
            if found is None:
                raise click.BadParameter(unknown("step id", s, steps) + " (`attnlab run --help` lists them)",
                                         param_hint="--sections")
            out.append(found)
    return out


@main.command()
@click.option("--out", "out_dir", default="attnlab-out", show_default=True, type=click.Path(file_okay=False),
              help="Folder for report.html, results.jsonl, results.csv and plots/.")
@click.option("--label", default=None, help="A name for this run, shown in the report.")
@click.option("--quick", is_flag=True, help="Smallest sizes: a smoke test of every step.")
@click.option("--sections", default=None, help="Comma-separated step ids to run (default: all): " + ", ".join(STEP_IDS) + ".")
@click.option("--resume", is_flag=True, help="Go on with a stopped run in --out: cells measured there are not measured again.")
def run(out_dir, label, quick, sections, resume):
    """Run the codelab's steps and write a report."""
    from ..lab import STEPS, run_lab

    chosen = step_ids(sections, STEPS) if sections else None
    writable_folder(out_dir)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as prog:
        task = prog.add_task("attnlab run", total=len(chosen or STEPS))

        def progress(sid, i, n):
            prog.update(task, completed=i, description=f"step {sid}")

        with writes_to(out_dir):
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
