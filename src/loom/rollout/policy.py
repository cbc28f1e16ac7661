"""Rollout-level policy interfaces: the views policies read and the decisions they return.

Three families decide the when, where and how of a rollout (Heddle §3): a `TurnScheduler`
orders each worker's waiting turns, a `Router` places turns (and moves trajectories'
KV caches), a `ResourcePlanner` picks the model-parallel degree of every worker. Policies are
plain objects: no I/O, no clock; the simulator and the runtime both call them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from loom.core.registry import Registry

__all__ = [
    "PlacementKind",
    "ResourcePlanner",
    "Router",
    "SchedulerKind",
    "TrajectoryView",
    "TurnScheduler",
    "WorkerLayout",
    "WorkerView",
]


class TrajectoryView(Protocol):
    """What a policy may read about a trajectory: its past, never its future."""

    @property
    def traj_id(self) -> int: ...
    @property
    def prompt_id(self) -> int: ...
    @property
    def steps_done(self) -> int: ...  # completed LLM turns
    @property
    def generated(self) -> int: ...  # output tokens so far
    @property
    def context(self) -> int: ...  # tokens in its context so far
    @property
    def first_arrival_s(self) -> float: ...
    @property
    def turn_arrival_s(self) -> float: ...  # when its current turn was submitted
    @property
    def predicted_total(self) -> float: ...  # latest predicted total output tokens
    @property
    def host(self) -> int: ...  # worker holding its latest KV cache, -1 if none


class WorkerView(Protocol):
    @property
    def idx(self) -> int: ...
    @property
    def tp(self) -> int: ...
    @property
    def node(self) -> int: ...
    @property
    def load(self) -> int: ...  # outstanding turns: running + waiting
    def cached_tokens(self, traj_id: int) -> int: ...  # prefix of that trajectory held here


class TurnScheduler(Protocol):
    """Orders a worker's waiting turns: a lower key runs first. A preemptive scheduler lets a
    waiting turn evict the running turn with the highest key when the worker is full.

    `priority_eviction`: the worker's prefix cache follows the same order: idle KV caches go
    lowest priority first, and never to make room for a turn that their trajectory outranks
    (a trajectory-centric scheduler persists the KV of the trajectories it favours). False:
    least recently used first, as the radix cache under step-centric serving."""

    preemptive: bool
    priority_eviction: bool

    def key(self, t: TrajectoryView, now: float) -> float: ...

    def outranks(self, waiting: float, running: float) -> bool:
        """Whether a waiting turn with key `waiting` may preempt one running with `running`."""


class Router:
    """Places trajectories on workers. A base class: every hook but `route` has a no-op
    default, so a driver calls each hook on every router (no `isinstance` checks) and a
    placement overrides only the hooks it needs.

    `move_pays`, where a driver injects it, says whether moving a trajectory from one worker
    to another (by index) pays for prefilling its context there: a router that moves
    trajectories (`migrate`) asks it first. `central_queue`: the router holds turns itself
    (`route` returns None, `drain` places them), so the driver moves no waiting turn between
    workers of its own accord."""

    move_pays: Callable[[TrajectoryView, int, int], bool] | None = None
    central_queue: bool = False

    def start(self, trajs: Sequence[TrajectoryView], workers: Sequence[WorkerView]) -> None:
        """Called before the first turn with every trajectory of a batch. The simulator calls it
        once; the runtime calls it again for every batch declared while others run, and with
        no trajectories when the workers change (added, drained, failed): the router then
        re-plans the trajectories it still tracks over `workers`."""

    def join(self, t: TrajectoryView, workers: Sequence[WorkerView]) -> None:
        """A trajectory that no declared batch named arrives (runtime only): track it."""

    def route(self, t: TrajectoryView, workers: Sequence[WorkerView], now: float) -> int | None:
        """The worker that runs `t`'s next turn, or None: the router holds the turn in a
        central queue of its own until `drain` places it (ROSE's). Only routers that
        override `drain` may return None."""
        raise NotImplementedError

    def home(self, traj_id: int) -> int | None:
        """The worker `traj_id`'s next turn would go to as planned now, or None where the
        router places turns only when they are ready. A read: nothing is placed."""
        return None

    def migrate(self, t: TrajectoryView, workers: Sequence[WorkerView], now: float) -> int | None:
        """Called when `t` starts a tool call, or while it waits (in a tool call or a queue)
        after `stale` named it: a worker to move it and its KV cache to, or None to leave it
        where it is."""
        return None

    def finish(self, t: TrajectoryView) -> None:
        """Called when `t` has finished its last turn."""

    def stale(self) -> Sequence[int]:
        """Trajectories (ids) that the router would now place elsewhere although nothing new
        is known about them (e.g. the active set shrank); called after every turn."""
        return ()

    def drain(self, workers: Sequence[WorkerView], now: float) -> list[tuple[int, int]]:
        """Capacity changed: turns held by `route` that now fit, as (trajectory id, worker
        index). Routers without a central queue hold nothing."""
        return []

    def withdraw(self, traj_id: int) -> bool:
        """A held turn is gone (its client left): forget it. Whether one was held."""
        return False

    def release(self, traj_id: int) -> None:
        """The trajectory's worker gave its turn back (aborted, stalled, failed)."""

    def set_version(self, version: int) -> None:
        """Weights of `version` are current."""


@dataclass(frozen=True, kw_only=True)
class WorkerLayout:
    """Model-parallel degree per worker, in the order workers are numbered."""

    degrees: tuple[int, ...]

    @property
    def num_gpus(self) -> int:
        return sum(self.degrees)


class ResourcePlanner(Protocol):
    """Chooses worker degrees for a GPU budget, given predicted trajectory lengths."""

    def plan(self, predicted_lengths: Sequence[float], total_gpus: int) -> WorkerLayout: ...


class SchedulerKind(StrEnum):
    PPS = "pps"
    FCFS = "fcfs"
    RR = "rr"
    SJF = "sjf"


class PlacementKind(StrEnum):
    HEDDLE = "heddle"  # presorted DP + runtime migration
    CACHE_AWARE = "cache_aware"  # verl: pin a trajectory to one worker
    LEAST_LOAD = "least_load"  # slime: each turn to the least-loaded worker
    HYBRID = "hybrid"  # verl*/SGLang router: least-load beyond a skew threshold, else cache
    ROSE = "rose"  # ROSE §4.3: affinity, then dedicated, then lent engines; a central queue


SCHEDULERS: Registry[SchedulerKind, type] = Registry("turn scheduler", SchedulerKind)
ROUTERS: Registry[PlacementKind, type] = Registry("placement", PlacementKind)
