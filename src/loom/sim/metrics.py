"""Metrics collection for simulations: counters, per-key samples and time series."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Metrics"]


@dataclass
class Metrics:
    """Counters add up; samples keep every value; series keep (time, value) points."""

    counters: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    samples: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    series: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))

    def count(self, name: str, amount: float = 1.0) -> None:
        self.counters[name] += amount

    def sample(self, name: str, value: float) -> None:
        self.samples[name].append(value)

    def point(self, name: str, time: float, value: float) -> None:
        self.series[name].append((time, value))

    def mean(self, name: str) -> float:
        vals = self.samples.get(name)
        return float(np.mean(vals)) if vals else float("nan")

    def quantile(self, name: str, q: float) -> float:
        vals = self.samples.get(name)
        return float(np.quantile(vals, q)) if vals else float("nan")
