"""What the router knows: trajectories (the `TrajectoryView` policies read) and engines (the
`WorkerView` policies read). Plain objects owned by the driver's event loop; nothing here does
I/O. Turns are in `turn.py`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

from loom.runtime.rollout.admission import Capacity, Pace
from loom.runtime.rollout.config import EngineConfig
from loom.runtime.rollout.engines import EngineClient, EngineLoad

if TYPE_CHECKING:
    from loom.runtime.rollout.turn import Turn

__all__ = ["EngineState", "Trajectory", "TurnRecord"]


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One finished turn, as the predictor's history keeps it."""

    input_tokens: int  # tokens appended before it (prompt or tool output)
    output_tokens: int
    tool_latency_s: float | None  # time until the next turn arrived; None for the last


@dataclass(eq=False)
class Trajectory:
    """One trajectory as the router sees it; satisfies `loom.rollout.TrajectoryView`."""

    traj_id: int
    key: str  # the client's id
    prompt_id: int
    group: str | None
    declared: bool
    first_arrival_s: float
    predicted_total: float = 1.0
    steps_done: int = 0
    generated: int = 0
    context: int = 0
    turn_arrival_s: float = 0.0
    host: int = -1
    prompt_tokens: int = 0
    records: list[TurnRecord] = field(default_factory=list)
    last_end_s: float | None = None  # when its last turn ended (a tool call began)
    last_seen_s: float = 0.0
    # its turns in flight, by seq: agent frameworks branch, and n > 1 samples are siblings
    active: dict[int, Turn] = field(default_factory=dict)
    # tokens of its context each engine (by index) computed last: a prefix it may hold cached
    prefix: dict[int, int] = field(default_factory=dict)
    migrated: bool = False  # the router moved its home since its last turn ran
    ended: bool = False
    started: bool = False  # its first turn arrived
    one_turn: bool = False  # anonymous: ends with its only request

    @property
    def pending_context(self) -> int:
        """Tokens in the longest prompt of its turns in flight (else its context so far)."""
        if not self.active:
            return self.context
        return max(len(t.prompt) for t in self.active.values())


@dataclass(eq=False)
class EngineState:
    """One engine; satisfies `loom.rollout.WorkerView`."""

    idx: int
    id: str
    config: EngineConfig
    client: EngineClient
    model: str
    running: dict[int, Turn] = field(default_factory=dict)  # by turn seq
    waiting: SortedList = field(default_factory=lambda: SortedList(key=lambda t: (t.key, t.seq)))
    labels: dict[str, str] = field(default_factory=dict)  # the gateway's worker labels
    alive: bool = True
    draining: bool = False
    failures: int = 0  # health checks failed in a row
    trajectories: Mapping[int, Trajectory] = field(default_factory=dict)
    version: int = 0  # weight version it serves
    # what a lent engine's co-serving executor reports (ROSE): None / inf until it does
    free_tokens: int | None = None  # rollout KV tokens it can still take
    reported_slack_s: float = math.inf  # its serving-SLO slack
    stalled: bool = False  # a turn stalled there since the last report: read as no slack
    capacity: Capacity = field(default_factory=Capacity)  # its room, by what it says
    pace: Pace = field(default_factory=Pace)  # measured over its finished attempts
    reported: EngineLoad | None = None  # its latest load report
    send_priority: bool = True  # requests carry the scheduler's key as their priority
    # counters for /v1/stats
    admitted: int = 0
    completed: int = 0
    preempted: int = 0
    failed_turns: int = 0
    tokens: int = 0

    @property
    def tp(self) -> int:
        return self.config.tp

    @property
    def node(self) -> int:
        return self.config.node

    @property
    def max_running(self) -> int | None:
        """The cap it is configured with (None: none)."""
        return self.config.max_running

    @property
    def limit(self) -> float:
        """Turns of the router's it runs at once without queueing them (`Capacity`)."""
        return self.capacity.limit

    @property
    def lent(self) -> bool:
        return self.config.lent

    @property
    def slack_s(self) -> float:
        return -math.inf if self.stalled else self.reported_slack_s

    @property
    def activated(self) -> bool:
        """An engine joins once it answers the probe: its rollout model is resident."""
        return True

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def routable(self) -> bool:
        return self.alive and not self.draining

    def cached_tokens(self, traj_id: int) -> int:
        t = self.trajectories.get(traj_id)
        return t.context if t is not None and t.host == self.idx else 0

    def has_slot(self) -> bool:
        """It would run one more turn at once rather than queue it."""
        return self.alive and len(self.running) < self.capacity.limit
