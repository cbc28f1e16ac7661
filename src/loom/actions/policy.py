"""The action-policy family: one signature for Tangram and every baseline it is compared with.

A driver (the simulator or the action server) submits actions, asks `schedule(now)` which
actions start now and on what, and reports each one's end with `finish`. Decisions are data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from loom.actions.managers.base import Grant
from loom.core.actions import ActionSpec
from loom.core.registry import Registry

__all__ = ["ACTION_POLICIES", "ActionPolicy", "ActionPolicyKind", "Start"]


class ActionPolicyKind(StrEnum):
    TANGRAM = "tangram"  # elastic scheduler with greedy eviction (Algorithm 1)
    TANGRAM_LOOKAHEAD = "tangram_lookahead"  # the same, estimating expected arrivals too
    DOP4 = "dop4"  # same managers, elastic actions fixed at 4 units
    DOP16 = "dop16"  # same managers, elastic actions fixed at 16 units
    K8S = "k8s"  # a pod per trajectory for its whole life
    SGLANG_STATIC = "sglang_static"  # each service on its own dedicated GPUs
    INDEPENDENT_API = "independent_api"  # each trajectory calls APIs itself, with retries
    SERVERLESSLLM = "serverlessllm"  # model-as-a-service without elastic reallocation


@dataclass(frozen=True, kw_only=True)
class Start:
    """One action to start now: its key-resource units, the grants of every manager it
    touches, the restoration overhead to pay first and the expected execution time."""

    action: ActionSpec
    units: int
    domain: str
    grants: tuple[Grant, ...]
    overhead_s: float
    expected_s: float

    @property
    def cores(self) -> tuple[int, ...]:
        return tuple(c for g in self.grants for c in g.cores)

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(d for g in self.grants for d in g.gpus)


class ActionPolicy(Protocol):
    def submit(self, action: ActionSpec, now: float) -> None:
        """Queue an action; raises ConfigError when it could never run."""

    def schedule(self, now: float) -> Sequence[Start]:
        """The actions that start now (they leave the queue)."""

    def finish(self, action_id: str, now: float) -> None:
        """A started action ended (any way): release what it held."""

    def cancel(self, action_id: str) -> bool:
        """Drop a queued action; False when it is not queued (already started or unknown)."""

    def end_trajectory(self, trajectory_id: str, now: float) -> None:
        """The trajectory is done: free its long-lived state."""

    def next_wakeup(self, now: float) -> float | None:
        """A time at which `schedule` may start something without any other event."""

    @property
    def queued(self) -> int: ...

    @property
    def running(self) -> int: ...


ACTION_POLICIES: Registry[ActionPolicyKind, Callable[..., ActionPolicy]] = Registry(
    "action", ActionPolicyKind
)
"""Factories taking the resource managers (and options) and returning a policy."""
