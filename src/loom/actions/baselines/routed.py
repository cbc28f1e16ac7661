"""One policy per action kind behind the `ActionPolicy` signature: how a workload-specific
baseline of §6.1 is assembled (DeepSearch: independent API calls plus an SGLang judge)."""

from __future__ import annotations

from collections.abc import Mapping

from loom.actions.policy import ActionPolicy, Start
from loom.core.actions import ActionKind, ActionSpec
from loom.core.errors import ConfigError

__all__ = ["Routed"]


class Routed:
    """Sends each action to the policy of its kind; the others never see it."""

    def __init__(self, routes: Mapping[ActionKind, ActionPolicy]) -> None:
        if not routes:
            raise ConfigError("a routed policy needs at least one route")
        self.routes = dict(routes)
        self._unique = list({id(p): p for p in self.routes.values()}.values())
        self._owner: dict[str, ActionPolicy] = {}

    @property
    def queued(self) -> int:
        return sum(p.queued for p in self._unique)

    @property
    def running(self) -> int:
        return sum(p.running for p in self._unique)

    def begin_trajectory(self, trajectory_id: str, now: float) -> None:
        for p in self._unique:
            begin = getattr(p, "begin_trajectory", None)
            if begin is not None:
                begin(trajectory_id, now)

    def submit(self, action: ActionSpec, now: float) -> None:
        policy = self.routes.get(action.kind)
        if policy is None:
            known = ", ".join(str(k) for k in self.routes)
            raise ConfigError(f"no policy for {action.kind} actions (routes: {known})")
        policy.submit(action, now)
        self._owner[action.action_id] = policy

    def schedule(self, now: float) -> list[Start]:
        return [s for p in self._unique for s in p.schedule(now)]

    def finish(self, action_id: str, now: float) -> None:
        policy = self._owner.pop(action_id, None)
        if policy is None:
            raise ConfigError(f"action {action_id!r} is not running")
        policy.finish(action_id, now)

    def cancel(self, action_id: str) -> bool:
        policy = self._owner.get(action_id)
        if policy is None or not policy.cancel(action_id):
            return False
        del self._owner[action_id]
        return True

    def end_trajectory(self, trajectory_id: str, now: float) -> None:
        for p in self._unique:
            p.end_trajectory(trajectory_id, now)

    def next_wakeup(self, now: float) -> float | None:
        times = [t for p in self._unique if (t := p.next_wakeup(now)) is not None]
        return min(times) if times else None
