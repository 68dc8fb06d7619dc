"""Measurement: timers (CUPTI kernel time, wall, pipelined, compile), memory, peaks, one-cell records."""
from ..core.records import STATUSES
from .cell import MODES, Cell, Options, measure_cell, record_key
from .stats import Stats
from .timers import kernel_timer_available

__all__ = ["Cell", "Options", "measure_cell", "record_key", "MODES", "STATUSES", "Stats", "kernel_timer_available"]
