"""The command group every ``attnlab`` command registers on, and what the commands share."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile

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


def _why(e: OSError) -> str:
    """"Read-only file system", "Permission denied", ...: an OSError's reason without its path."""
    return e.strerror or type(e).__name__


def writable_folder(path: str, what: str = "--out") -> str:
    """``path``, created (with its parents) if missing and checked by writing a file there, before any
    work starts; else one line naming the folder and the reason (read-only file system, permission,
    a file on the path, a path under /proc) and exit 2."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        _fail(f"{what} {path}: cannot write there ({_why(e)})")
    return path


@contextlib.contextmanager
def writes_to(path: str, what: str = "--out"):
    """Turn an OSError on a file under ``path`` (the disk filled, the folder turned read-only mid-run)
    into one line and exit 2; any other error passes."""
    try:
        yield
    except OSError as e:
        root = os.path.abspath(path)
        name = os.path.abspath(os.fsdecode(e.filename)) if e.filename else ""
        if name != root and not name.startswith(root + os.sep):
            raise
        _fail(f"{what} {path}: cannot write {name} ({_why(e)})")
