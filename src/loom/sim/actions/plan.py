"""What a trajectory does at the action level: LLM turns, summarised by their latencies,
alternating with actions whose true durations are drawn ahead of time (seeded)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from loom.core.actions import ActionSpec
from loom.core.errors import ConfigError

__all__ = ["ActionStep", "Stage", "TrajectoryPlan"]


class Stage(StrEnum):
    """Which part of a trajectory an action belongs to (Fig. 7's breakdown)."""

    TOOL = "tool"  # environment interaction or API call during the rollout
    REWARD = "reward"  # reward computation at the end (tests, judge, teacher logprobs)


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionStep:
    """One LLM turn of `llm_s` seconds, then the action it emits.

    `noise` is the true execution time over the profiled one: the simulator runs the action
    for `spec.duration_s(units) * noise` (or, for an API call, the provider's latency is
    `spec.t_ori_s * noise`). Policies only ever see the profile.
    """

    llm_s: float
    spec: ActionSpec
    stage: Stage
    noise: float = 1.0

    def __post_init__(self) -> None:
        if not self.llm_s >= 0:
            raise ConfigError(f"{self.spec.action_id}: llm_s must be >= 0, got {self.llm_s}")
        if not self.noise > 0:
            raise ConfigError(f"{self.spec.action_id}: noise must be > 0, got {self.noise}")


@dataclass(frozen=True, kw_only=True)
class TrajectoryPlan:
    """The ground truth of one trajectory: its steps in order, then `tail_llm_s` of LLM
    generation after the last action. `task` names a sub-task (a MOPD domain, say)."""

    trajectory_id: str
    workload: str
    steps: tuple[ActionStep, ...]
    tail_llm_s: float = 0.0
    task: str = field(default="")

    def __post_init__(self) -> None:
        if not self.tail_llm_s >= 0:
            raise ConfigError(f"{self.trajectory_id}: tail_llm_s must be >= 0")
        ids = [s.spec.action_id for s in self.steps]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"{self.trajectory_id}: action ids repeat")
        for s in self.steps:
            if s.spec.trajectory_id != self.trajectory_id:
                raise ConfigError(
                    f"action {s.spec.action_id!r} belongs to {s.spec.trajectory_id!r}, "
                    f"not {self.trajectory_id!r}"
                )

    @property
    def llm_s(self) -> float:
        return sum(s.llm_s for s in self.steps) + self.tail_llm_s
