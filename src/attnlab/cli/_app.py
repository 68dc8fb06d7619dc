"""The command group every ``attnlab`` command registers on, and what the commands share."""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
import tempfile
import traceback

import click
from rich.console import Console
from rich.markup import escape

from ..measure import threads
from . import _start

console = Console(emoji=False)     # ":x:" in a path or a name is text, never an emoji


#: Seconds the process waits, as it exits, for background threads still inside XLA (compiles ahead,
#: an abandoned cell) before it leaves without tearing the interpreter down: Ctrl-C answers in about a second.
EXIT_GRACE_S = 0.5


def leave(code: int) -> None:
    """End the process with ``code``. A background thread still inside XLA's C++ when the interpreter
    shuts down aborts it (exit 134, "terminate called ...", or a segmentation fault:
    ``attnlab.measure.threads``): what has not begun is cancelled, what runs is waited for
    ``EXIT_GRACE_S``, and where one still runs the output is flushed and the process leaves with
    ``os._exit`` (every record is already on disk, fsync'd). After Ctrl-C (130) it leaves so too:
    the interpreter's teardown of JAX and XLA takes over a second on a busy CPU, and Ctrl-C answers
    in about one."""
    left = []
    if "attnlab.measure.threads" in sys.modules:   # no JAX was loaded: nothing can run

        try:
            left = threads.settle(EXIT_GRACE_S)
        except KeyboardInterrupt:   # a second Ctrl-C: leave at once
            left, code = [True], 130
    if left or code == 130:
        logging.shutdown()
        for f in (console.file, sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # noqa: BLE001 - a closed pipe: nothing more can be said
                pass
        os._exit(code)
    _start.tearing_down()
    sys.exit(code)


class _Main(click.Group):
    def __call__(self, *args, **kwargs):
        """The process's entry (the ``attnlab`` script, ``python -m attnlab.cli``): click's standalone
        handling, except that Ctrl-C anywhere is exit 130 (not click's 1), and every way out goes
        through ``leave`` (``CliRunner`` calls ``main`` and stays in its process). A command that fails
        after Ctrl-C (an import that the signal broke: ``_start``) is 130 too."""
        _start.reset()
        try:
            rv = self.main(*args, standalone_mode=False, **kwargs)
            code = rv if type(rv) is int else 0   # an Exit's code; a command's own return value is not one
        except click.ClickException as e:
            e.show()
            code = e.exit_code
        except click.Abort as e:   # Ctrl-C (or end of input) outside a sweep's own handling
            click.echo("Aborted!", err=True)
            code = 130 if isinstance(e.__cause__, KeyboardInterrupt) else 1
        except KeyboardInterrupt:
            code = 130
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException as e:  # noqa: BLE001 - a bug: its traceback, then the same careful exit
            if not (isinstance(e, OSError) and e.errno == errno.EPIPE):   # a closed pipe: nothing to say
                traceback.print_exc()
            code = 1
        if code not in (0, 130) and _start.seen():
            code = 130
        leave(code)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="attnlab")
def main():
    """attnlab: which attention path should I use, is it correct, how fast is it, what does it cost?"""


def _fail(msg: str):
    Console(stderr=True, soft_wrap=True, emoji=False).print(f"[red]error:[/] {escape(msg)}", highlight=False)
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
    """Turn an OSError on a file under ``path`` (the folder turned read-only mid-run), or a full disk or quota
    (a write or flush, which names no file), into one line and exit 2; any other error passes."""
    try:
        yield
    except OSError as e:
        root = os.path.abspath(path)
        name = os.path.abspath(os.fsdecode(e.filename)) if e.filename else ""
        if e.filename is None and e.errno in (errno.ENOSPC, errno.EDQUOT):
            _fail(f"{what} {path}: cannot write ({_why(e)})")
        if name != root and not name.startswith(root + os.sep):
            raise
        _fail(f"{what} {path}: cannot write {name} ({_why(e)})")
