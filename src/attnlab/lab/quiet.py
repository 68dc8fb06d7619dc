"""A quiet terminal for ``attnlab run``: the logs of XLA, absl, TransformerEngine and tokamax go to a file.

The file is the run's log: ``logs_to`` opens it with a line saying what runs (the command line) and
when, ``stamp`` adds the run's own lines (each step as it starts and ends, the cells it measures, the
cost line), and the libraries' output falls in between where it was written.

XLA's C++ logs write to file descriptor 2 directly (they bypass Python's ``sys.stderr``), so the
file descriptor itself is redirected, not only the Python object. Python's warnings and ``logging``
(absl, tokamax) write to ``sys.stderr``, which is pointed at the same file for the duration.
Imports no JAX.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sys
import time
import warnings

#: Environment set before JAX loads XLA: drop XLA's INFO lines (its warnings and errors still go to the log).
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "1"}


def prepare_environment() -> None:
    """Set ``QUIET_ENV`` where the user has not (call before JAX is imported: XLA reads it once)."""
    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)


@contextlib.contextmanager
def logs_to(path: str, *, append: bool = False):
    """Send everything written to stderr (fd 2 and ``sys.stderr``), Python warnings and ``logging``
    records to ``path`` while the block runs; restore the terminal afterwards, even on Ctrl-C."""
    prepare_environment()
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    log = open(path, "a" if append else "w", encoding="utf-8", buffering=1)
    stamp(log, f"log of: {shlex.join(['attnlab', *sys.argv[1:]])} (pid {os.getpid()})")
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved_fd = os.dup(2)
    saved_stderr = sys.stderr
    os.dup2(log.fileno(), 2)
    sys.stderr = log
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    _absl_quiet()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            yield log
    finally:
        root.removeHandler(handler)
        with contextlib.suppress(Exception):
            log.flush()
        os.dup2(saved_fd, 2)
        os.close(saved_fd)
        sys.stderr = saved_stderr
        log.close()


def stamp(log, text: str) -> None:
    """One line of the run's own in the log (``log``: a file open for writing, or a path), with its UTC time."""
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} attnlab: {text}\n"
    if isinstance(log, (str, os.PathLike)):
        with open(log, "a", encoding="utf-8") as f:
            f.write(line)
    else:
        log.write(line)
        log.flush()


def _absl_quiet() -> None:
    """absl (JAX's Python logging) at WARNING, where it is loaded."""
    absl = sys.modules.get("absl.logging")
    if absl is not None:
        with contextlib.suppress(Exception):
            absl.set_verbosity(absl.WARNING)

