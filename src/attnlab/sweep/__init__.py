"""Declarative sweeps (``Sweep``), the engine that runs them, and comparison of two runs."""
from .compare import compare, load
from .engine import run_sweep, time_ms
from .spec import Sweep, SweepError, build, load_toml

__all__ = ["Sweep", "SweepError", "build", "load_toml", "run_sweep", "time_ms", "compare", "load"]
