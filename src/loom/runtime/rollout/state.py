"""What the router knows: trajectories (the `TrajectoryView` policies read), engines (the
`WorkerView` policies read) and the fleet of engines. Plain objects owned by the router's
core; nothing here does I/O. A turn's states, transitions and request are in `turn.py`."""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

from loom.core.errors import Conflict, NotFound
from loom.runtime.rollout.admission import Capacity, Pace
from loom.runtime.rollout.turn import (
    TRANSITIONS,
    EngineLoad,
    Key,
    LogprobSpec,
    PromptLogprob,
    TokenLogprob,
    TurnRequest,
    TurnState,
    TurnStateError,
)

if TYPE_CHECKING:
    from loom.perf.transfer import KvLinks
    from loom.runtime.rollout.config import EngineConfig
    from loom.runtime.rollout.engines import EngineClient

__all__ = ["EngineState", "Fleet", "Trajectory", "Turn", "TurnRecord", "UnknownEngine"]

log = logging.getLogger("loom.rollout")


class UnknownEngine(NotFound):
    def __str__(self) -> str:
        return f"unknown engine {self.args[0]!r}"


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
    last_turn: Turn | None = None  # its latest turn that an engine finished: its context
    moving: int | None = None  # the engine (index) its KV is on its way to
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
    client: EngineClient | None  # the driver's (the core never calls it)
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
    high_first: bool = False  # it runs higher `priority` values first (SGLang's default)
    kv: KvLinks | None = None  # what its KV moves over, where it moves KV (Loom's engines)
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
        """It would run one more turn at once rather than queue it (or queue it within the
        `queue` turns it is configured to hold in its own queue)."""
        return self.alive and len(self.running) < self.capacity.limit + self.config.queue


_seqs = itertools.count()


@dataclass(eq=False)
class Turn:
    """One LLM call of a trajectory. `generated` (and `logprobs`) survive preemption and
    failover: a resumed attempt sends prompt + generated and asks only for what is missing."""

    traj: Trajectory
    index: int
    prompt: list[int]
    request: TurnRequest
    arrival_s: float
    generated: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[PromptLogprob] | None = None
    text: list[str] = field(default_factory=list)
    state: TurnState = TurnState.NEW
    engine: EngineState | None = None
    attempt: int = 0
    key: Key = (0, 1, 0.0)  # its rank while it waits: lower first
    aged: bool = False  # it has waited the router's bound: it runs next
    waited_s: float = 0.0  # time it waited in the router before its current wait
    wait_since: float | None = None  # when its current wait began (None: not waiting)
    seq: int = field(default_factory=lambda: next(_seqs))
    choice: int = 0  # its index among the n samples of its request
    started_s: float | None = None  # first admission (queueing delay ends)
    first_token_s: float | None = None
    ended_s: float | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    abort_message: str | None = None
    error: str | None = None
    error_status: int = 502
    preemptions: int = 0
    failovers: int = 0
    # why its next attempt goes where it goes (what a prefill again there is counted as):
    # "placement", "migration", "late_binding", "preemption" or "failover"
    bound: str = "placement"
    computed: int = 0  # tokens of its sequence an engine computed before (an attempt that stopped)
    attempt_s: float = 0.0  # when its current attempt started
    cached_tokens: int = 0
    version: int | None = None  # weight version of the engine that produced its last tokens
    routed_experts: Any = None  # the last attempt's, when asked (SGLang engines)
    progress_t: float = 0.0  # when its attempt started or last delivered a chunk
    attempt_chunks: int = 0  # chunks its current attempt has delivered
    # the driver's: whoever waits on the turn (the core never reads them)
    finished: Any = None  # woken once it ends
    updates: Any = None  # a streaming client's feed: each chunk, then None once it ended

    # ---- reads ---------------------------------------------------------------------------

    @property
    def sampling(self) -> dict[str, Any]:
        return self.request.sampling

    @property
    def max_tokens(self) -> int:
        return int(self.sampling["max_tokens"])

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.generated)

    @property
    def ended(self) -> bool:
        return self.state.ended

    def waited(self, now: float) -> float:
        """Time it has waited in the router, all attempts together, up to `now`."""
        return self.waited_s + (now - self.wait_since if self.wait_since is not None else 0.0)

    def rid(self, attempt: int | None = None) -> str:
        """The engine-side id of attempt number `attempt` (default: the current one): one
        request, named exactly."""
        n = self.attempt if attempt is None else attempt
        return f"{self.traj.traj_id}-{self.index}-{n}-{self.seq}"

    def attempt_sampling(self) -> dict[str, Any]:
        """The current attempt's parameters: only the tokens still missing."""
        params = dict(self.sampling)
        params["max_tokens"] = self.remaining
        if "min_tokens" in params:
            params["min_tokens"] = max(0, int(params["min_tokens"]) - len(self.generated))
        return params

    def attempt_logprobs(self) -> LogprobSpec:
        """What the current attempt asks for: prompt logprobs only until one attempt gave
        them (a resumed attempt's prompt also holds the tokens generated so far)."""
        spec = self.request.logprobs
        if spec.prompt_start is not None and self.prompt_logprobs is not None:
            return LogprobSpec(spec.output, spec.top)
        return spec

    # ---- transitions ---------------------------------------------------------------------

    def _to(self, state: TurnState) -> None:
        if state not in TRANSITIONS[self.state]:
            raise TurnStateError(f"turn {self.rid()}: {self.state.name} -> {state.name}")
        self.state = state

    def hold(self, now: float) -> None:
        """No engine can take it now: it waits in the router, bound to none."""
        self._to(TurnState.HELD)
        self.engine = None
        self._wait(now)

    def queue(self, engine: EngineState, key: Key, now: float) -> None:
        """It waits in `engine`'s queue, ordered by `key`."""
        self._to(TurnState.QUEUED)
        self.engine = engine
        self.key = key
        self._wait(now)

    def run(self, now: float) -> int:
        """An attempt starts at its engine; returns the attempt's number."""
        self._to(TurnState.RUNNING)
        if self.started_s is None:
            self.started_s = now
        self.attempt_s = now
        self._stop_waiting(now)
        return self.attempt

    def _wait(self, now: float) -> None:
        if self.wait_since is None:
            self.wait_since = now

    def _stop_waiting(self, now: float) -> None:
        if self.wait_since is not None:
            self.waited_s += now - self.wait_since
            self.wait_since = None

    def interrupt(self) -> str:
        """The running attempt stops (preemption, failover, abort): later events of that
        attempt are ignored. Returns the engine-side id of the attempt that stopped. The
        state changes with the next transition (queue, hold or end)."""
        if self.state is not TurnState.RUNNING:
            raise TurnStateError(f"turn {self.rid()}: interrupt while {self.state.name}")
        rid = self.rid()
        self.attempt += 1
        return rid

    def end(self, now: float, *, error: str | None = None, status: int = 502) -> None:
        """It ends: FINISHED with its output (`finish_reason` set by the caller), or FAILED
        with `error` for the client."""
        if error is not None:
            self._to(TurnState.FAILED)
            self.error = error
            self.error_status = status
            self.finish_reason = "error"
        else:
            self._to(TurnState.FINISHED)
            self.finish_reason = self.finish_reason or "stop"
        self._stop_waiting(now)
        self.ended_s = now


class Fleet:
    """The engines behind the router and the current weight version: which are live, which
    drain, which serve the current weights. Registration's probe is the driver's; the fleet
    keeps the state."""

    def __init__(self) -> None:
        self.engines: dict[str, EngineState] = {}
        self.version = 0  # the current weight version: engines behind it take no new turns
        self._live: list[EngineState] | None = None
        self._current: list[EngineState] | None = None
        self._kinds: frozenset[Any] | None = None
        self._idx = itertools.count()

    def next_idx(self) -> int:
        return next(self._idx)

    def add(self, e: EngineState) -> None:
        known = self.by_url(e.config.url)
        if known is not None:
            raise Conflict(f"engine {e.config.url} is already registered as {known.id}")
        if e.id in self.engines:
            raise Conflict(f"an engine named {e.id!r} exists already")
        self.engines[e.id] = e
        self._kinds = None
        self.changed()

    def get(self, key: str) -> EngineState:
        """An engine by id, or by the URL it registered with (SGLang's gateway names workers
        by URL)."""
        e = self.engines.get(key) or self.by_url(key)
        if e is None:
            raise UnknownEngine(key)
        return e

    def by_idx(self, idx: int) -> EngineState | None:
        return next((e for e in self.engines.values() if e.idx == idx), None)

    def by_url(self, url: str) -> EngineState | None:
        url = url.rstrip("/")
        if "://" not in url:  # a URL in a path segment loses a slash: http:/host:port
            url = url.replace(":/", "://", 1)
        return next((e for e in self.engines.values() if e.config.url == url), None)

    def forget_if_drained(self, e: EngineState) -> bool:
        """Forget `e` if it is draining and empty; whether it was forgotten now."""
        if e.draining and not e.running and not e.waiting and self.engines.get(e.id) is e:
            del self.engines[e.id]
            self._kinds = None
            self.changed()
            return True
        return False

    def changed(self) -> None:
        """An engine joined, left, failed, came back, drained or changed weights."""
        self._live = self._current = None

    def kinds(self) -> frozenset[Any]:
        """The dialects (`EngineKind`) of the registered engines."""
        if self._kinds is None:
            self._kinds = frozenset(e.config.kind for e in self.engines.values())
        return self._kinds

    def live(self) -> list[EngineState]:
        """Routable engines, largest degree first (Heddle's DP expects that order). The
        caller must not change the list."""
        if self._live is None:
            self._live = sorted(
                (e for e in self.engines.values() if e.routable), key=lambda e: (-e.tp, e.idx)
            )
        return self._live

    def current(self) -> list[EngineState]:
        """Routable engines at the current weight version (the caller must not change it)."""
        if self._current is None:
            self._current = [e for e in self.live() if e.version == self.version]
        return self._current

    def mark_down(self, e: EngineState, reason: str) -> bool:
        """Take `e` out; whether it was in."""
        if not e.alive:
            return False
        log.warning("engine %s is out: %s", e.id, reason)
        e.alive = False
        self.changed()
        return True

    def mark_up(self, e: EngineState) -> bool:
        if e.alive:
            return False
        log.info("engine %s is back", e.id)
        e.alive = True
        e.failures = 0
        self.changed()
        return True

    def drain(self, e: EngineState) -> None:
        """`e` takes no new turns."""
        e.draining = True
        self.changed()

    def undrain(self, e: EngineState) -> bool:
        """`e` takes turns again; whether it was draining."""
        if not e.draining:
            return False
        log.info("engine %s is taken back", e.id)
        e.draining = False
        self.changed()
        return True

    def set_weights(self, version: int, engines: Sequence[str] = ()) -> list[EngineState]:
        """Weights of `version` are current; `engines` serve them already. Returns the
        engines behind."""
        if version < self.version:
            raise Conflict(f"weight version {version} is older than the current {self.version}")
        for eid in engines:
            if eid not in self.engines:
                raise UnknownEngine(eid)
        self.version = version
        for eid in engines:
            self.engines[eid].version = version
        self.changed()
        return [e for e in self.engines.values() if e.version != version]

    def report(
        self,
        eid: str,
        *,
        version: int | None = None,
        free_tokens: int | None = None,
        slack_s: float | None = None,
    ) -> EngineState:
        """What an engine's side says of it: the weight version it has loaded; for a lent
        engine, the rollout KV tokens it can still take and its serving-SLO slack."""
        e = self.engines.get(eid)
        if e is None:
            raise UnknownEngine(eid)
        if version is not None and version < e.version:
            raise Conflict(f"engine {eid} serves version {e.version}; {version} is older")
        if free_tokens is not None and free_tokens < 0:
            raise Conflict(f"free_tokens must be >= 0, got {free_tokens}")
        if version is not None:
            e.version = version
            self.changed()
        if free_tokens is not None:
            e.free_tokens = free_tokens
            e.stalled = False
        if slack_s is not None:
            e.reported_slack_s = slack_s
            e.stalled = False
        return e
