"""What an action-level run measured: one record per action, trajectory and RL step.

ACT = queueing + overhead + execution: `queue_s` from submission to the policy's start,
`overhead_s` the restoration (or pod start-up) the start carried, `exec_s` the rest until the
action ended (API retries and their back-off included).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from loom.core.actions import ActionKind, ActionStatus
from loom.sim.actions.plan import Stage

__all__ = ["ActionRecord", "SimResult", "StepRecord", "TrajectoryRecord"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionRecord:
    action_id: str
    trajectory_id: str
    workload: str
    task: str
    stage: Stage
    kind: ActionKind
    rl_step: int
    submit_s: float
    start_s: float
    end_s: float
    units: int
    domain: str  # the node or API it ran on
    overhead_s: float
    status: ActionStatus
    attempts: int = 1  # API calls made (1 + retries)

    @property
    def act_s(self) -> float:
        return self.end_s - self.submit_s

    @property
    def queue_s(self) -> float:
        return self.start_s - self.submit_s

    @property
    def exec_s(self) -> float:
        return self.end_s - self.start_s - self.overhead_s


@dataclass(frozen=True, slots=True, kw_only=True)
class TrajectoryRecord:
    trajectory_id: str
    workload: str
    task: str
    rl_step: int
    start_s: float
    end_s: float
    llm_s: float  # LLM generation (reissued turns included)
    tool_s: float  # sum of the ACTs of its tool actions
    reward_s: float  # sum of the ACTs of its reward actions
    actions: int
    failed: int
    run: int = 0  # 0: the batch's own trajectory; k: the k-th re-run of its prompt

    @property
    def effective(self) -> bool:
        """No action of it finally failed (§6.2's pass rate)."""
        return self.failed == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    rl_step: int
    start_s: float
    end_s: float  # when the last trajectory of the batch finished

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


Filter = Callable[[ActionRecord], bool]


@dataclass(frozen=True, kw_only=True)
class SimResult:
    actions: tuple[ActionRecord, ...]
    trajectories: tuple[TrajectoryRecord, ...]
    steps: tuple[StepRecord, ...]
    counters: dict[str, float] = field(default_factory=dict)
    decisions: int = 0  # calls of the policy's schedule()

    def select(self, keep: Filter | None = None) -> list[ActionRecord]:
        return [a for a in self.actions if keep is None or keep(a)]

    def avg_act_s(self, keep: Filter | None = None) -> float:
        return _mean([a.act_s for a in self.select(keep)])

    def breakdown(self, keep: Filter | None = None) -> dict[str, float]:
        """Mean queueing, overhead and execution per action (Table 1)."""
        sel = self.select(keep)
        return {
            "queue_s": _mean([a.queue_s for a in sel]),
            "overhead_s": _mean([a.overhead_s for a in sel]),
            "exec_s": _mean([a.exec_s for a in sel]),
        }

    def per_trajectory(self, workload: str | None = None) -> dict[str, float]:
        """Mean per trajectory of its LLM, tool and reward time and of its total ACT (§6.3's
        "total ACT per trajectory")."""
        ts = [t for t in self.trajectories if workload is None or t.workload == workload]
        return {
            "llm_s": _mean([t.llm_s for t in ts]),
            "tool_s": _mean([t.tool_s for t in ts]),
            "reward_s": _mean([t.reward_s for t in ts]),
            "traj_act_s": _mean([t.tool_s + t.reward_s for t in ts]),
            "traj_s": _mean([t.end_s - t.start_s for t in ts]),
        }

    def windows(self, width_s: float, keep: Filter | None = None) -> list[tuple[float, float, int]]:
        """(window start, mean ACT, count) of the actions that ended in each window."""
        sel = self.select(keep)
        if not sel:
            return []
        ends = np.array([a.end_s for a in sel])
        acts = np.array([a.act_s for a in sel])
        idx = np.floor(ends / width_s).astype(np.int64)
        out = []
        for w in np.unique(idx).tolist():
            mask = idx == w
            out.append((w * width_s, float(acts[mask].mean()), int(mask.sum())))
        return out

    @property
    def makespan_s(self) -> float:
        return max((s.end_s for s in self.steps), default=0.0)

    def mean_step_s(self) -> float:
        return _mean([s.duration_s for s in self.steps])


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else math.nan
