"""What the router knows: trajectories (the `TrajectoryView` policies read), the turns in
flight, and engines (the `WorkerView` policies read). Plain objects owned by the driver's
event loop; nothing here does I/O."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sortedcontainers import SortedList

from loom.runtime.rollout.config import EngineConfig
from loom.runtime.rollout.engines import Delta, EngineClient

__all__ = ["EngineState", "Trajectory", "Turn", "TurnPhase", "TurnRecord"]


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
    active: Turn | None = None
    ended: bool = False
    started: bool = False  # its first turn arrived
    one_turn: bool = False  # anonymous: ends with its only turn

    @property
    def pending_context(self) -> int:
        """Tokens in the prompt of its turn in flight (else its context so far)."""
        return len(self.active.prompt) if self.active is not None else self.context


class TurnPhase(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"


_rid = itertools.count()


@dataclass(eq=False)
class Turn:
    """One LLM call of a trajectory. `generated` survives preemption and failover: a resumed
    attempt sends prompt + generated and asks only for the tokens still missing."""

    traj: Trajectory
    index: int
    prompt: list[int]
    sampling: dict[str, Any]  # OpenAI names; max_tokens always set
    arrival_s: float
    generated: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    attempt: int = 0
    phase: TurnPhase = TurnPhase.WAITING
    engine: EngineState | None = None
    key: float = 0.0
    seq: int = field(default_factory=lambda: next(_rid))
    started_s: float | None = None  # first admission (queueing delay ends)
    first_token_s: float | None = None
    ended_s: float | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    error: str | None = None
    error_status: int = 502
    preemptions: int = 0
    failovers: int = 0
    cached_tokens: int = 0
    task: asyncio.Task[None] | None = None
    updates: asyncio.Queue[Delta | None] = field(default_factory=asyncio.Queue)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    abandoned: bool = False  # the client went away: stop at the next chance

    @property
    def max_tokens(self) -> int:
        return int(self.sampling["max_tokens"])

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.generated)

    def rid(self) -> str:
        """The engine-side id of the current attempt: one request, named exactly."""
        return f"{self.traj.traj_id}-{self.index}-{self.attempt}-{self.seq}"

    def attempt_sampling(self) -> dict[str, Any]:
        """The current attempt's parameters: only the tokens still missing."""
        params = dict(self.sampling)
        params["max_tokens"] = self.remaining
        if "min_tokens" in params:
            params["min_tokens"] = max(0, int(params["min_tokens"]) - len(self.generated))
        return params


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
    alive: bool = True
    draining: bool = False
    failures: int = 0  # health checks failed in a row
    trajectories: Mapping[int, Trajectory] = field(default_factory=dict)
    version: int = 0  # weight version it serves
    # what a lent engine's co-serving executor reports (ROSE): None / inf until it does
    free_tokens: int | None = None  # rollout KV tokens it can still take
    reported_slack_s: float = math.inf  # its serving-SLO slack
    stalled: bool = False  # a turn stalled there since the last report: read as no slack
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
    def max_running(self) -> int:
        return self.config.max_running

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
        return len(self.running) < self.max_running
