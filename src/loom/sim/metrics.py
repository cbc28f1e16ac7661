"""Metrics collection for simulations: counters, per-key samples and time series, and the
GPU-hour meter the cluster simulators share (RollMux's elastic pools, PlexRL's fixed ones)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

__all__ = ["GpuMeter", "Metrics"]


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


@dataclass
class GpuMeter:
    """GPU-seconds per pool: provisioned (a pool's GPU count is a step function of time, set
    when it changes, or held over an interval) and busy (what phases used of it)."""

    provisioned: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    busy: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    _gpus: dict[str, float] = field(default_factory=dict)
    _since: dict[str, float] = field(default_factory=dict)

    def set(self, pool: str, gpus: float, now: float) -> None:
        """From `now` on, `pool` holds `gpus` GPUs."""
        if gpus < 0:
            raise ValueError(f"{pool}: a pool cannot hold {gpus} GPUs")
        self.advance(pool, now)
        self._gpus[pool] = gpus

    def advance(self, pool: str, now: float) -> None:
        since = self._since.get(pool)
        if since is not None:
            if now < since:
                raise ValueError(f"{pool}: time went back from {since} to {now}")
            self.provisioned[pool] += self._gpus.get(pool, 0.0) * (now - since)
        self._since[pool] = now

    def hold(self, pool: str, gpus: float, start: float, end: float) -> None:
        """`pool` held `gpus` more GPUs from `start` to `end`."""
        if gpus < 0 or end < start:
            raise ValueError(f"{pool}: {gpus} GPUs from {start} to {end}")
        self.provisioned[pool] += gpus * (end - start)

    def use(self, pool: str, gpu_s: float) -> None:
        self.busy[pool] += gpu_s

    def gpu_hours(self, pool: str | None = None) -> float:
        pools = [pool] if pool is not None else list(self.provisioned)
        return sum(self.provisioned.get(p, 0.0) for p in pools) / 3600
