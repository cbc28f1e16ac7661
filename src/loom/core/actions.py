"""Action vocabulary: tool and reward calls with vector costs over external resources."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from functools import cached_property

from loom.core.errors import ConfigError
from loom.core.resources import FeasibleSet

__all__ = ["ActionKind", "ActionSpec", "ActionStatus", "Elasticity"]


class ActionKind(StrEnum):
    CPU_TOOL = "cpu_tool"  # sandboxed command: code run, tests, file edits
    GPU_SERVICE = "gpu_service"  # reward model, LLM judge, teacher model
    API = "api"  # external API under quotas


class ActionStatus(IntEnum):
    """Ordered lifecycle: `status >= SUCCEEDED` means terminal."""

    QUEUED = 0
    RUNNING = 1
    SUCCEEDED = 2
    FAILED = 3
    CANCELLED = 4
    TIMED_OUT = 5

    @property
    def terminal(self) -> bool:
        return self >= ActionStatus.SUCCEEDED


Elasticity = Mapping[int, float] | Callable[[int], float]


@dataclass(frozen=True, kw_only=True)
class ActionSpec:
    """An action's demand: a feasible set per resource key, one key elastic resource whose
    unit count the scheduler picks, the profiled single-unit duration `t_ori_s`, and the
    elasticity E(m) (None = unknown: the scheduler gives it the minimum units)."""

    action_id: str
    trajectory_id: str
    kind: ActionKind
    demand: Mapping[str, FeasibleSet]
    t_ori_s: float
    key_resource: str | None = None
    elasticity: Elasticity | None = None
    service: str | None = None
    meta: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.t_ori_s >= 0:
            raise ConfigError(f"action {self.action_id!r}: t_ori_s must be >= 0")
        if self.key_resource is not None and self.key_resource not in self.demand:
            raise ConfigError(
                f"action {self.action_id!r}: key resource {self.key_resource!r} has no demand"
            )

    @cached_property
    def elastic(self) -> bool:
        if self.key_resource is None:
            return False
        return len(self.demand[self.key_resource].values()) > 1

    def speedup(self, units: int) -> float:
        """E(m)·m: how much faster `units` of the key resource are than one unit."""
        if self.elasticity is None or not self.elastic:
            return 1.0
        e = self.elasticity(units) if callable(self.elasticity) else self.elasticity[units]
        return e * units

    def duration_s(self, units: int) -> float:
        """getDur(m) = T_ori / (E(m)·m)."""
        if units < 1:
            raise ConfigError(f"action {self.action_id!r}: units must be >= 1, got {units}")
        return self.t_ori_s / self.speedup(units)
