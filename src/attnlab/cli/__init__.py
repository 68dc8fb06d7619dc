"""The ``attnlab`` command line: ``run``, ``bench``, ``compare``, ``scaling``, ``env``, ``backends``, ``ceilings``, ``models``, ``advise``, ``tune``.

One module per command group; each registers its commands on ``main`` (``_app``)."""
from __future__ import annotations

from . import _start

_start.watch()
try:
    from . import advise, bench, env, models, run, tune  # noqa: F401  (registers the commands)
    from ._app import _fail, console, main
    from .bench import _print_bench_table, _resume_command
    from .env import _print_backends, ceilings_table
    from .tables import bench_cell_text
except KeyboardInterrupt:
    _start.after_imports(interrupted=True)
_start.after_imports()

__all__ = ["main", "console", "bench_cell_text", "ceilings_table"]
