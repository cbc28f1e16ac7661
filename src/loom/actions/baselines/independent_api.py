"""The DeepSearch baseline of §6.1: no traffic control. Every trajectory calls the API itself
the moment its agent asks, so nothing is queued here; the provider rejects calls over its
concurrency or quota, and the caller retries them (the driver models provider and client)."""

from __future__ import annotations

from collections.abc import Sequence

from loom.actions.managers.base import Grant, ResourceManager
from loom.actions.policy import ACTION_POLICIES, ActionPolicyKind, Start
from loom.core.actions import ActionKind, ActionSpec
from loom.core.errors import ConfigError

__all__ = ["IndependentApi"]


class IndependentApi:
    """Starts every submitted API action at once, one unit of its API, no overhead."""

    def __init__(self) -> None:
        self._queue: dict[str, ActionSpec] = {}
        self._running: set[str] = set()

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    def submit(self, action: ActionSpec, now: float) -> None:
        if action.kind != ActionKind.API:
            raise ConfigError(
                f"independent_api runs API actions only; {action.action_id!r} is {action.kind}"
            )
        if not any(k.startswith("api:") for k in action.demand):
            raise ConfigError(f"action {action.action_id!r} names no API")
        if action.action_id in self._queue or action.action_id in self._running:
            raise ConfigError(f"action id {action.action_id!r} is already queued or running")
        self._queue[action.action_id] = action

    def schedule(self, now: float) -> list[Start]:
        out = []
        for a in self._queue.values():
            key = next(k for k in a.demand if k.startswith("api:"))
            grant = Grant(action_id=a.action_id, manager="api", domain=key, units=1)
            out.append(
                Start(
                    action=a,
                    units=1,
                    domain=key,
                    grants=(grant,),
                    overhead_s=0.0,
                    expected_s=a.t_ori_s,
                )
            )
            self._running.add(a.action_id)
        self._queue.clear()
        return out

    def finish(self, action_id: str, now: float) -> None:
        if action_id not in self._running:
            raise ConfigError(f"action {action_id!r} is not running")
        self._running.remove(action_id)

    def cancel(self, action_id: str) -> bool:
        return self._queue.pop(action_id, None) is not None

    def end_trajectory(self, trajectory_id: str, now: float) -> None:
        return None

    def next_wakeup(self, now: float) -> float | None:
        return None


@ACTION_POLICIES.register(ActionPolicyKind.INDEPENDENT_API)
def independent_api(managers: Sequence[ResourceManager] = ()) -> IndependentApi:
    return IndependentApi()
