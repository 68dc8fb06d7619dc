"""Summary statistics of repeated timings (milliseconds)."""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Stats:
    median: float
    min: float
    max: float
    p25: float
    p75: float
    n: int

    @property
    def iqr(self) -> float:
        return self.p75 - self.p25

    @classmethod
    def of(cls, samples) -> "Stats":
        a = np.asarray([float(x) for x in samples], dtype=np.float64)
        if a.size == 0:
            raise ValueError("no samples")
        return cls(float(np.median(a)), float(a.min()), float(a.max()),
                   float(np.percentile(a, 25)), float(np.percentile(a, 75)), int(a.size))

    def as_dict(self, prefix: str) -> dict:
        return {f"{prefix}_ms": self.median, f"{prefix}_min_ms": self.min, f"{prefix}_max_ms": self.max,
                f"{prefix}_p25_ms": self.p25, f"{prefix}_p75_ms": self.p75, f"{prefix}_iqr_ms": self.iqr,
                f"{prefix}_n": self.n}
