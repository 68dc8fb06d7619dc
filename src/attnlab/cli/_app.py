"""The command group every ``attnlab`` command registers on, and what the commands share."""
from __future__ import annotations

import sys

import click
from rich.console import Console

console = Console()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="attnlab")
def main():
    """attnlab: which attention path should I use, is it correct, how fast is it, what does it cost?"""


def _fail(msg: str):
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {escape(msg)}", highlight=False)
    sys.exit(2)
