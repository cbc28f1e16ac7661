"""A router policy for tests of moves: each trajectory's next turn goes to the engine its
last turn did not run on, so that every tool call moves it."""

from __future__ import annotations

from loom.rollout.policy import Router


class Across(Router):
    """Each trajectory's next turn goes to the engine its last turn did not run on."""

    def __init__(self) -> None:
        self.home: dict[int, int] = {}

    def route(self, t, workers, now):  # type: ignore[no-untyped-def]
        return self.home.setdefault(t.traj_id, workers[0].idx)

    def migrate(self, t, workers, now):  # type: ignore[no-untyped-def]
        other = next((w.idx for w in workers if w.idx != t.host), None)
        if t.host < 0 or other is None:
            return None
        self.home[t.traj_id] = other
        return other
