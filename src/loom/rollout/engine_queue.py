"""An inference engine's own request queue as a `TurnScheduler`: vLLM's `fcfs` and `priority`
scheduling policies (`--scheduling-policy`), for a worker that models the engine itself rather
than a rollout system's scheduler inside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from loom.rollout.baselines import NonPreemptive
from loom.rollout.policy import TrajectoryView

__all__ = ["EngineQueue", "EngineSchedulingPolicy"]


class EngineSchedulingPolicy(StrEnum):
    FCFS = "fcfs"  # vLLM's default: arrival order
    PRIORITY = "priority"  # the request's `priority` (lower first), then arrival


@dataclass
class EngineQueue(NonPreemptive):
    """Orders an engine's waiting requests by their `priority` (all equal under `fcfs`); the
    worker's queue order (arrival) breaks ties. As in vLLM, a waiting request never evicts a
    running one (preemption happens only when KV memory runs out, to the lowest-priority,
    latest request) and the prefix cache evicts least recently used first.

    `priorities` maps a worker's trajectory id to its request's priority; the engine that
    owns the worker keeps it current."""

    policy: EngineSchedulingPolicy = EngineSchedulingPolicy.PRIORITY
    priorities: dict[int, float] = field(default_factory=dict)

    def key(self, t: TrajectoryView, now: float) -> float:
        if self.policy is EngineSchedulingPolicy.FCFS:
            return 0.0
        return self.priorities.get(t.traj_id, 0.0)
