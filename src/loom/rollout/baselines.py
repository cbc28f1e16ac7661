"""Baseline rollout policies: step-centric schedulers and the routers of verl, slime, verl*."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loom.core.errors import ConfigError
from loom.rollout.policy import (
    ROUTERS,
    SCHEDULERS,
    PlacementKind,
    Router,
    SchedulerKind,
    TrajectoryView,
    WorkerView,
)

__all__ = [
    "CacheAwareRouter",
    "FcfsScheduler",
    "HybridRouter",
    "LeastLoadRouter",
    "NonPreemptive",
    "RoundRobinScheduler",
    "SjfScheduler",
]


class NonPreemptive:
    """Shared by the step-centric baselines: they never preempt, and their engines' prefix
    caches evict least recently used first."""

    preemptive = False
    priority_eviction = False

    def outranks(self, waiting: float, running: float) -> bool:
        return False


@SCHEDULERS.register(SchedulerKind.FCFS)
@dataclass
class FcfsScheduler(NonPreemptive):
    """First come, first served at trajectory granularity: earlier trajectories go first."""

    def key(self, t: TrajectoryView, now: float) -> float:
        return t.first_arrival_s + t.traj_id * 1e-9


@SCHEDULERS.register(SchedulerKind.RR)
@dataclass
class RoundRobinScheduler(NonPreemptive):
    """Step-centric: a turn back from a tool call joins the tail, like a new request."""

    def key(self, t: TrajectoryView, now: float) -> float:
        return t.turn_arrival_s


@SCHEDULERS.register(SchedulerKind.SJF)
@dataclass
class SjfScheduler(NonPreemptive):
    """Autellix-like shortest-job-first: least attained service (tokens generated) first, so
    programs that have run little are not blocked behind long ones (program-level LAS)."""

    def key(self, t: TrajectoryView, now: float) -> float:
        return float(t.generated)


def _least_loaded(workers: Sequence[WorkerView]) -> int:
    return min(workers, key=lambda w: (w.load, w.idx)).idx


@ROUTERS.register(PlacementKind.CACHE_AWARE)
@dataclass
class CacheAwareRouter(Router):
    """verl: pin each trajectory to one worker (spread in submission order) for its whole life."""

    def __post_init__(self) -> None:
        self._pin: dict[int, int] = {}
        self._next = 0  # round-robin cursor over the workers

    def start(self, trajs: Sequence[TrajectoryView], workers: Sequence[WorkerView]) -> None:
        """Pins the batch in submission order; a later call (runtime) re-pins only the
        trajectories whose worker is gone."""
        if not workers:
            raise ConfigError("routing needs at least one worker")
        live = {w.idx for w in workers}
        for traj_id, w in list(self._pin.items()):
            if w not in live:
                self._pin[traj_id] = self._spread(workers)
        for t in trajs:
            if self._pin.get(t.traj_id) not in live:
                self._pin[t.traj_id] = self._spread(workers)

    def _spread(self, workers: Sequence[WorkerView]) -> int:
        w = workers[self._next % len(workers)].idx
        self._next += 1
        return w

    def join(self, t: TrajectoryView, workers: Sequence[WorkerView]) -> None:
        self._pin.setdefault(t.traj_id, _least_loaded(workers))

    def home(self, traj_id: int) -> int | None:
        return self._pin.get(traj_id)

    def route(self, t: TrajectoryView, workers: Sequence[WorkerView], now: float) -> int:
        if t.traj_id not in self._pin:
            self._pin[t.traj_id] = _least_loaded(workers)
        return self._pin[t.traj_id]

    def finish(self, t: TrajectoryView) -> None:
        self._pin.pop(t.traj_id, None)


@ROUTERS.register(PlacementKind.LEAST_LOAD)
@dataclass
class LeastLoadRouter(Router):
    """slime: every turn goes to the worker with the fewest outstanding turns."""

    def start(self, trajs: Sequence[TrajectoryView], workers: Sequence[WorkerView]) -> None:
        if not workers:
            raise ConfigError("routing needs at least one worker")

    def route(self, t: TrajectoryView, workers: Sequence[WorkerView], now: float) -> int:
        return _least_loaded(workers)


@ROUTERS.register(PlacementKind.HYBRID)
@dataclass
class HybridRouter(Router):
    """verl* / SGLang router: if max load / min load exceeds `threshold`, least-load;
    otherwise the worker holding the longest cached prefix (least-load when none does)."""

    threshold: float = 32.0

    def __post_init__(self) -> None:
        if not self.threshold >= 1.0:
            raise ConfigError(f"load-skew threshold must be >= 1, got {self.threshold}")

    def start(self, trajs: Sequence[TrajectoryView], workers: Sequence[WorkerView]) -> None:
        if not workers:
            raise ConfigError("routing needs at least one worker")

    def route(self, t: TrajectoryView, workers: Sequence[WorkerView], now: float) -> int:
        loads = [w.load for w in workers]
        if max(loads) > self.threshold * max(min(loads), 1):
            return _least_loaded(workers)
        best = max(workers, key=lambda w: (w.cached_tokens(t.traj_id), -w.load, -w.idx))
        if best.cached_tokens(t.traj_id) == 0:
            return _least_loaded(workers)
        return best.idx
