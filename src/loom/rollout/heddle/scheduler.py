"""Heddle's progressive priority scheduling (§4.2, Algorithm 1).

Longest predicted trajectory first (an adaptive LPT discipline): a turn's key is its
trajectory's latest predicted total length, refreshed after every step, and a waiting turn
that outranks the lowest-priority running turn preempts it (its KV cache is kept as a
cached prefix). The worker applies the ordering and the preemption; this object decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom.core.errors import ConfigError
from loom.rollout.policy import SCHEDULERS, SchedulerKind, TrajectoryView

__all__ = ["ProgressivePriorityScheduler"]


@SCHEDULERS.register(SchedulerKind.PPS)
@dataclass
class ProgressivePriorityScheduler:
    """`margin`: a waiting trajectory preempts only if predicted more than (1 + margin)
    times longer than the victim. NOTE: Algorithm 1 preempts on any strict outranking
    (the default, margin 0); a margin avoids trading places on prediction noise, which costs a
    recomputation whenever the victim's persisted KV is evicted under memory pressure."""

    margin: float = 0.0
    preemptive: bool = True

    def __post_init__(self) -> None:
        if not self.margin >= 0:
            raise ConfigError(f"preemption margin must be >= 0, got {self.margin}")

    def key(self, t: TrajectoryView, now: float) -> float:
        # Lower keys run first: the longest predicted trajectory gets the smallest key.
        return -float(t.predicted_total)

    def outranks(self, waiting: float, running: float) -> bool:
        return -waiting > -running * (1.0 + self.margin)
