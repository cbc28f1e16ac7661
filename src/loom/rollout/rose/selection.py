"""Which serving GPUs an RL job borrows (§4, "System Workflow"): at job start, up to
N_serving serving instances with the lowest KV-cache usage over a recent window (e.g. one hour),
each lent to at most one RL job; the rollout model is then activated on them (≤ 5 s for
Qwen3-32B over PCIe/NVLink, §4.1), and they are given back when the job ends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from loom.core.errors import ConfigError

__all__ = ["ACTIVATION_S", "Lending", "UsageSample"]

ACTIVATION_S = 5.0  # §4.1: activating Qwen3-32B completes within 5 s


@dataclass(frozen=True)
class UsageSample:
    """KV-cache usage of one serving instance (fraction of its KV pool) at a time."""

    instance: str
    time_s: float
    kv_usage: float


@dataclass
class Lending:
    """The serving cluster's ledger: which instance is lent to which job."""

    instances: Sequence[str]
    window_s: float = field(default=3600.0, metadata={"help": "§4: 'e.g., 1 hour'"})
    lent: dict[str, str] = field(default_factory=dict)  # instance -> job

    def __post_init__(self) -> None:
        if len(set(self.instances)) != len(self.instances):
            raise ConfigError("serving instance names must be unique")
        if not self.window_s > 0:
            raise ConfigError(f"window_s must be > 0, got {self.window_s}")

    def mean_usage(self, samples: Sequence[UsageSample], now: float) -> dict[str, float]:
        """Each instance's mean KV usage over the window before `now` (instances without a
        sample in it count as idle, 0)."""
        known = set(self.instances)
        sums: dict[str, list[float]] = {i: [] for i in self.instances}
        for s in samples:
            if s.instance not in known:
                raise ConfigError(f"usage sample of unknown instance {s.instance!r}")
            if not 0.0 <= s.kv_usage <= 1.0:
                raise ConfigError(f"KV usage must be in [0, 1], got {s.kv_usage}")
            if now - self.window_s <= s.time_s <= now:
                sums[s.instance].append(s.kv_usage)
        return {i: float(np.mean(v)) if v else 0.0 for i, v in sums.items()}

    def borrow(self, job: str, n: int, samples: Sequence[UsageSample], now: float) -> list[str]:
        """Lend `job` up to `n` free instances, least used first (ties by name)."""
        if n < 0:
            raise ConfigError(f"cannot borrow {n} instances")
        if job in self.lent.values():
            raise ConfigError(f"job {job!r} already borrows serving instances")
        usage = self.mean_usage(samples, now)
        free = sorted((usage[i], i) for i in self.instances if i not in self.lent)
        chosen = [i for _, i in free[:n]]
        for i in chosen:
            self.lent[i] = job
        return chosen

    def give_back(self, job: str) -> list[str]:
        """The job ended: its instances serve alone again."""
        mine = sorted(i for i, j in self.lent.items() if j == job)
        for i in mine:
            del self.lent[i]
        return mine

    def of(self, job: str) -> list[str]:
        return sorted(i for i, j in self.lent.items() if j == job)

    def jobs(self) -> Mapping[str, list[str]]:
        out: dict[str, list[str]] = {}
        for i, j in sorted(self.lent.items()):
            out.setdefault(j, []).append(i)
        return out
