"""Heddle's progressive priority scheduling (§4.2, Algorithm 1).

Longest predicted trajectory first (an adaptive LPT discipline): a turn's key is its
trajectory's latest predicted total length, refreshed after every step, and a waiting turn
that outranks the lowest-priority running turn preempts it (its KV cache is kept as a
cached prefix). The worker applies the ordering, the preemption and, with
`priority_eviction`, the same order to its prefix cache; this object decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom.core.errors import ConfigError
from loom.rollout.policy import SCHEDULERS, SchedulerKind, TrajectoryView

__all__ = ["ProgressivePriorityScheduler"]

# Key offset of a trajectory without a runtime prediction: more tokens than any prediction.
_UNPLANNED = 1e12


@SCHEDULERS.register(SchedulerKind.PPS)
@dataclass
class ProgressivePriorityScheduler:
    """`margin`: a waiting trajectory preempts only if predicted more than (1 + margin)
    times longer than the victim. NOTE: Algorithm 1 preempts on any strict outranking
    (the default, margin 0); a margin avoids trading places on prediction noise, which costs a
    recomputation whenever the victim's persisted KV is evicted under memory pressure.

    `priority_eviction`: Algorithm 1 persists the KV cache of preempted trajectories, and a
    trajectory-centric worker keeps a trajectory's KV through its tool calls: a cached prefix
    is never evicted for a turn that its trajectory outranks. Without it (plain LRU) a
    long-tail trajectory's context can be evicted during a short tool call to admit a shorter
    turn that it then preempts on return, and the whole context is prefilled again.

    `plan_first`: Algorithm 1 sets a trajectory's priority from the progressive predictor when
    it returns from a tool call; before its first step there is only the prompt-level
    estimate, which recalls about a third of the long tail where the prediction after the
    plan recalls two thirds (Fig. 13). Ranked among runtime predictions, that estimate starves
    the long-tail trajectories it misses until the predicted-long ones finish. Trajectories
    still on their first step therefore rank ahead of all others (ordered by the prompt
    estimate), so every plan, the "strong semantic indicator" of §4.1, runs early and LPT
    orders the rest by runtime predictions. False: the prompt estimate competes directly."""

    margin: float = 0.0
    preemptive: bool = True
    priority_eviction: bool = True
    plan_first: bool = True

    def __post_init__(self) -> None:
        if not self.margin >= 0:
            raise ConfigError(f"preemption margin must be >= 0, got {self.margin}")

    def key(self, t: TrajectoryView, now: float) -> float:
        # Lower keys run first: the longest predicted trajectory gets the smallest key.
        predicted = float(t.predicted_total)
        if self.plan_first and t.steps_done == 0:
            return -(_UNPLANNED + predicted)
        return -predicted

    def outranks(self, waiting: float, running: float) -> bool:
        return -waiting > -running * (1.0 + self.margin)
