"""One action's life in the server: its request, its grant, its outcome and the times of each
step, read back as an `ActionView`."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from pydantic import JsonValue

from loom.actions.policy import Start
from loom.core.actions import ActionSpec, ActionStatus
from loom.runtime.actions.schemas import ActionRequest, ActionView, StatusName

__all__ = ["ActionRecord", "Clock", "Outcome"]


@dataclass(frozen=True)
class Clock:
    """Monotonic time for the policy and for durations, shown to clients as Unix time."""

    mono0: float = field(default_factory=time.monotonic)
    wall0: float = field(default_factory=time.time)

    def now(self) -> float:
        return time.monotonic()

    def wall(self, mono: float | None) -> float | None:
        return None if mono is None else self.wall0 + (mono - self.mono0)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How an execution ended."""

    status: ActionStatus
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    result: JsonValue = None
    error: str | None = None
    restored: bool = False

    def __post_init__(self) -> None:
        assert self.status.terminal, f"an outcome must be terminal, not {self.status.name}"


@dataclass(eq=False)
class ActionRecord:
    """Mutable state of one action, owned by the driver (one event loop: no locks)."""

    spec: ActionSpec
    request: ActionRequest
    submitted: float
    status: ActionStatus = ActionStatus.QUEUED
    start: Start | None = None
    scheduled: float | None = None
    started: float | None = None
    finished: float | None = None
    outcome: Outcome | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def id(self) -> str:
        return self.spec.action_id

    def mark_scheduled(self, start: Start, now: float) -> None:
        assert self.status is ActionStatus.QUEUED, f"{self.id} scheduled twice"
        self.start, self.scheduled, self.status = start, now, ActionStatus.RUNNING

    def mark_started(self, now: float) -> None:
        """Execution proper begins (after spawning or restoring)."""
        self.started = now

    def finish(self, outcome: Outcome, now: float) -> None:
        assert not self.status.terminal, f"{self.id} finished twice"
        self.outcome, self.status, self.finished = outcome, outcome.status, now
        if self.started is None and self.scheduled is not None:
            self.started = now  # it never executed: all of its time was overhead
        self.done.set()

    def view(self, clock: Clock) -> ActionView:
        o, s = self.outcome, self.start
        end = self.finished

        def span(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else max(b - a, 0.0)

        return ActionView(
            id=self.id,
            trajectory_id=self.spec.trajectory_id,
            kind=self.spec.kind,
            status=StatusName.of(self.status),
            exit_code=o.exit_code if o else None,
            stdout=o.stdout if o else "",
            stderr=o.stderr if o else "",
            output_truncated=o.truncated if o else False,
            result=o.result if o else None,
            error=o.error if o else None,
            restored=o.restored if o else False,
            units=s.units if s else None,
            cores=list(s.cores) if s else [],
            gpus=list(s.gpus) if s else [],
            domain=s.domain if s else None,
            expected_s=s.expected_s if s else None,
            submitted_at=self.submitted - clock.mono0 + clock.wall0,
            scheduled_at=clock.wall(self.scheduled),
            started_at=clock.wall(self.started),
            finished_at=clock.wall(end),
            queue_s=span(self.submitted, self.scheduled if s else end),
            overhead_s=span(self.scheduled, self.started),
            exec_s=span(self.started, end),
            act_s=span(self.submitted, end),
        )
