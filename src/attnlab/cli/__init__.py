"""The ``attnlab`` command line: ``run``, ``bench``, ``compare``, ``scaling``, ``env``, ``backends``, ``ceilings``, ``models``, ``advise``, ``tune``.

One module per command group; each registers its commands on ``main`` (``_app``)."""
from __future__ import annotations

from . import advise, bench, env, models, run, tune  # noqa: F401  (registers the commands)
from ._app import _fail, console, main
from .bench import _print_bench_table, _resume_command
from .tables import bench_cell_text
from .env import _print_backends, ceilings_table

__all__ = ["main", "console", "bench_cell_text", "ceilings_table"]
