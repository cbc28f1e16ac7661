"""One node group's operation queue under an operation policy (§4.4, §5.2.2): what runs next
and what setup it pays. The simulator and the runtime both drive this object, so the same
policy with the same operations and durations runs them in the same order in both.

The group runs one operation at a time. When the next operation belongs to another job than
the one resident, the group first offloads the resident job's state and loads the next job's
(§5.2.2's automatic context switching: "prepends offload and load operations").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loom.cluster.plexrl.hrrs import Op, OpPolicy, SetupCost
from loom.core.errors import ConfigError

__all__ = ["Dispatch", "GroupScheduler"]


@dataclass(frozen=True)
class Dispatch:
    """Run `op` now, after `setup_s` of switching: offload `offload` (if any), load `load`."""

    op: Op
    setup_s: float
    offload: str | None
    load: str | None


@dataclass
class GroupScheduler:
    policy: OpPolicy
    setup: SetupCost
    queue: list[Op] = field(default_factory=list)
    resident: str | None = None
    running: Op | None = None
    upcoming: list[str] = field(default_factory=list)  # jobs in the last plan's order

    def next_switch(self) -> str | None:
        """The job the last plan switches to next after the resident one (what a
        StateManager prefetches while the resident job runs)."""
        return next((j for j in self.upcoming if j != self.resident), None)

    def submit(self, op: Op) -> None:
        if any(o.op_id == op.op_id for o in self.queue):
            raise ConfigError(f"operation {op.op_id} is queued already")
        self.queue.append(op)

    def withdraw(self, job: str) -> list[Op]:
        """Take a job's queued operations out (the job left)."""
        gone = [o for o in self.queue if o.job == job]
        self.queue = [o for o in self.queue if o.job != job]
        if self.resident == job and (self.running is None or self.running.job != job):
            self.resident = None
        return gone

    def next(self, now: float) -> Dispatch | None:
        """The operation to start now (none while one runs or none is queued)."""
        if self.running is not None or not self.queue:
            return None
        plan = self.policy.plan(
            self.queue, now=now, resident=self.resident, busy_until=now, setup=self.setup
        )
        first = plan.next
        assert first is not None
        if first.start_s - first.setup_s > now + 1e-9:
            return None  # (a policy that waits for an arrival: not the list schedulers here)
        op = first.op
        self.upcoming = list(dict.fromkeys(p.op.job for p in plan.entries))
        self.queue.remove(op)
        switch = op.job != self.resident
        setup = self.setup(op.job, self.resident) if switch else 0.0
        out = Dispatch(op, setup, self.resident if switch else None, op.job if switch else None)
        self.running, self.resident = op, op.job
        return out

    def done(self, op_id: int) -> None:
        assert self.running is not None and self.running.op_id == op_id, "one operation at a time"
        self.running = None
