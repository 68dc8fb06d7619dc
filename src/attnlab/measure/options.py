"""How a cell is measured: repeats, budgets, input sets, the check switch (``measure_cell``'s options)."""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class Options:
    repeats: int | None = None          # timed calls (default: 20 on a GPU, 5 on a CPU)
    warmup: int = 2
    compile_budget_s: float | None = 300.0
    check: bool = True
    max_bytes: int | None = None        # a compiled peak above this is recorded as oom, not run
    max_input_sets: int = 8
    rotate_bytes: int | None = None     # inputs rotate until they exceed this (default: 3 x L2)
    pipelined_calls: int = 20
    pipelined_s: float = 0.5            # fewer pipelined calls (>= 2 a round) where 3 rounds would take longer
    seed: int = 0
    min_time_s: float = 0.1             # wall-clock timing (no CUPTI): keep sampling at least this long
    cell_budget_s: float | None = None  # a cell estimated (attnlab.measure.estimate) above this: over_budget, not run
    compile_ahead: bool = True          # sweeps: compile the next cell while this one runs (attnlab.measure.ahead)

    def input_sets(self, set_bytes: float, l2_bytes: int | None) -> int:
        """How many input sets of ``set_bytes`` bytes each a cell draws, so that its timed calls rotate past the
        device's L2 cache (``rotate_bytes``; default 3 x ``l2_bytes``, 64 MiB where unknown): at most
        ``max_input_sets`` and 4 GiB, at least 1."""
        one = max(set_bytes, 1)
        rotate = self.rotate_bytes if self.rotate_bytes is not None else 3 * (l2_bytes or 64 * 2**20)
        return max(1, min(self.max_input_sets, math.ceil(rotate / one), (4 * 2**30) // one))
