"""Cluster vocabulary: RL jobs iterate over phases (rollout, reference/reward, train, sync)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum

from loom.core.errors import ConfigError
from loom.core.topology import PoolRole

__all__ = ["JobStatus", "PhaseKind", "PhaseSpec", "PhaseStatus", "RLJobSpec"]


class PhaseKind(StrEnum):
    ROLLOUT = "rollout"
    REFERENCE = "reference"
    REWARD = "reward"
    TRAIN = "train"
    SYNC = "sync"


class PhaseStatus(IntEnum):
    """Ordered lifecycle of one phase instance: `status >= DONE` means finished."""

    PENDING = 0
    WAITING = 1  # ready, waiting for its pool
    LOADING = 2  # state moving to the device (warm or cold start)
    RUNNING = 3
    DONE = 4


class JobStatus(IntEnum):
    """Ordered lifecycle of an RL job: `status >= FINISHED` means it left the cluster."""

    SUBMITTED = 0
    ADMITTED = 1
    RUNNING = 2
    FINISHED = 3
    REJECTED = 4


@dataclass(frozen=True, kw_only=True)
class PhaseSpec:
    """One phase of an RL iteration: where it runs, how many GPUs, how long (estimate and
    worst case) and how much device memory its state needs to stay resident."""

    kind: PhaseKind
    pool: PoolRole
    gpus: int
    duration_s: float
    worst_case_s: float | None = None
    memory_gb: float = 0.0

    def __post_init__(self) -> None:
        if self.gpus < 0 or not self.duration_s >= 0 or self.memory_gb < 0:
            raise ConfigError(f"phase {self.kind}: gpus, duration and memory must be >= 0")
        if self.worst_case_s is not None and self.worst_case_s < self.duration_s:
            raise ConfigError(f"phase {self.kind}: worst case below the estimate")


@dataclass(frozen=True, kw_only=True)
class RLJobSpec:
    """An RL post-training job: a model, a repeating sequence of phases, a number of
    iterations, its arrival time and an SLO (allowed slowdown over running alone)."""

    job_id: str
    model: str
    phases: tuple[PhaseSpec, ...]
    iterations: int
    arrival_s: float = 0.0
    slo: float = float("inf")

    def __post_init__(self) -> None:
        if not self.phases:
            raise ConfigError(f"job {self.job_id!r} has no phases")
        if self.iterations < 1:
            raise ConfigError(f"job {self.job_id!r}: iterations must be >= 1")
        if not self.slo >= 1.0:
            raise ConfigError(f"job {self.job_id!r}: SLO must be >= 1 (a slowdown bound)")

    @property
    def iteration_time_s(self) -> float:
        """Solo iteration time: phases run back to back."""
        return sum(p.duration_s for p in self.phases)
