"""Heddle's progressive priority scheduling (§4.2, Algorithm 1).

Longest predicted trajectory first (an adaptive LPT discipline): a turn's key is its
trajectory's latest predicted total length, refreshed after every step, and a waiting turn
that outranks the lowest-priority running turn preempts it (its KV cache is kept as a
cached prefix). The worker applies the ordering and the preemption; this object decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom.rollout.policy import SCHEDULERS, SchedulerKind, TrajectoryView

__all__ = ["ProgressivePriorityScheduler"]


@SCHEDULERS.register(SchedulerKind.PPS)
@dataclass
class ProgressivePriorityScheduler:
    preemptive: bool = True

    def key(self, t: TrajectoryView, now: float) -> float:
        # Lower keys run first: the longest predicted trajectory gets the smallest key.
        return -float(t.predicted_total)
