"""The ``attnlab`` command line: ``run``, ``env``, ``backends``."""
from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table as RichTable

console = Console()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="attnlab")
def main():
    """attnlab: which attention path should I use, is it correct, how fast is it, what does it cost?"""


@main.command()
@click.option("--out", "out_dir", default="attnlab-out", show_default=True, type=click.Path(file_okay=False),
              help="Folder for report.html, results.jsonl, results.csv and plots/.")
@click.option("--label", default=None, help="A name for this run, shown in the report.")
@click.option("--quick", is_flag=True, help="Smallest sizes: a smoke test of every step.")
@click.option("--sections", default=None, help="Comma-separated step ids to run (default: all).")
def run(out_dir, label, quick, sections):
    """Run the codelab's steps and write a report."""
    from .lab import STEPS, run_lab

    chosen = [s.strip() for s in sections.split(",") if s.strip()] if sections else None
    if chosen:
        bad = [s for s in chosen if s not in STEPS]
        if bad:
            raise click.BadParameter(f"unknown section(s) {', '.join(bad)}; choose from {', '.join(STEPS)}", param_hint="--sections")
    with console.status("starting") as status:
        done = run_lab(out_dir, label=label, quick=quick, sections=chosen,
                       progress=lambda sid: status.update(f"running step [bold]{sid}[/]"))
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


@main.command("env")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def env_cmd(as_json):
    """Versions, devices, optional libraries and which backends can run here."""
    from . import env as envmod

    e = envmod.collect()
    if as_json:
        click.echo(json.dumps(e, indent=2))
        return
    t = RichTable(title="attnlab environment", show_header=False)
    for k in ("attnlab", "git_commit", "python", "jax", "jaxlib", "platform", "device_kind", "device_count",
              "compute_capability", "cudnn", "xla_flags"):
        t.add_row(k, str(e.get(k)))
    for lib, ver in e["optional"].items():
        t.add_row(f"optional: {lib}", ver or "not installed")
    console.print(t)
    _print_backends(e["backends"])
    if e.get("gpu_note"):
        console.print(f"[yellow]{e['gpu_note']}[/]")


def _print_backends(status: dict):
    t = RichTable(title="backends")
    for c in ("backend", "available", "why not", "version"):
        t.add_column(c, overflow="fold")
    for name, s in status.items():
        t.add_row(name, "[green]yes[/]" if s["available"] else "[red]no[/]", s["reason"] or "", s["version"] or "")
    console.print(t)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def backends(as_json):
    """Every registered backend, available or not, why not, and its library's version."""
    from . import env as envmod

    status = envmod.collect()["backends"]
    if as_json:
        click.echo(json.dumps(status, indent=2))
    else:
        _print_backends(status)


if __name__ == "__main__":  # pragma: no cover
    main()
