"""One LLM call of a trajectory as the router carries it: an explicit lifecycle.

A turn is NEW when submitted, HELD while no engine can take it (the placement's central
queue, or no engine at the current weights), QUEUED in an engine's queue in the router,
RUNNING while an attempt streams from an engine, and ends FINISHED (stop, length or abort,
with its output) or FAILED (an error for the client). A running turn that is preempted or
whose engine fails goes back to QUEUED or HELD and later resumes with prompt + generated,
asking only for the tokens still missing; the tokens and logprobs received so far stay with
it. `TRANSITIONS` is the whole graph; each state change is a method of the turn, and a
change the graph does not allow raises `TurnStateError`.

A turn keeps the time it has waited in the router (held or queued, over all its attempts):
once that reaches the router's bound it is `aged` and runs next (`Key`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loom.runtime.rollout.state import EngineState, Trajectory

__all__ = [
    "TRANSITIONS",
    "Key",
    "LogprobSpec",
    "PromptLogprob",
    "TokenLogprob",
    "Turn",
    "TurnRequest",
    "TurnState",
    "TurnStateError",
]


class TurnState(IntEnum):
    NEW = 0
    HELD = 1  # no engine can take it now: the placement's central queue, or the weights
    QUEUED = 2  # in an engine's queue in the router
    RUNNING = 3  # an attempt streams from an engine
    FINISHED = 10  # ended with its output: stop, length or abort
    FAILED = 11  # ended with an error for the client

    @property
    def ended(self) -> bool:
        return self >= TurnState.FINISHED


S = TurnState
TRANSITIONS: Mapping[TurnState, frozenset[TurnState]] = {
    S.NEW: frozenset({S.HELD, S.QUEUED, S.FINISHED, S.FAILED}),
    # HELD -> HELD: asked the placement again, still no engine
    S.HELD: frozenset({S.HELD, S.QUEUED, S.FINISHED, S.FAILED}),
    # QUEUED -> QUEUED: moved to another engine's queue (migration, drain, weights)
    S.QUEUED: frozenset({S.QUEUED, S.HELD, S.RUNNING, S.FINISHED, S.FAILED}),
    # RUNNING -> QUEUED/HELD: preempted, or its engine failed, stalled or was taken out
    S.RUNNING: frozenset({S.QUEUED, S.HELD, S.FINISHED, S.FAILED}),
    S.FINISHED: frozenset(),
    S.FAILED: frozenset(),
}


Key = tuple[int, int, float]
"""A waiting turn's rank, lower first: the client's priority class, then 0 for a turn that has
waited its bound (aged) and 1 for any other, then the scheduler's key (aged: the turn's
arrival, so that aged turns run oldest first)."""


class TurnStateError(RuntimeError):
    """A state change the turn lifecycle does not allow (a bug in the caller)."""


@dataclass(frozen=True, slots=True)
class LogprobSpec:
    """Which logprobs a turn returns: of each output token (`output`, with its `top` most
    likely alternatives), and of the prompt from position `prompt_start` (None: none) with
    `prompt_top` alternatives."""

    output: bool = False
    top: int = 0
    prompt_start: int | None = None
    prompt_top: int = 0

    @property
    def any(self) -> bool:
        return self.output or self.prompt_start is not None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A sampled token's logprob under the engine that sampled it, and its `top`
    alternatives as (token id, logprob), in the engine's order."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class PromptLogprob:
    """A prompt token's logprob given the tokens before it (None at position 0), its rank
    where the engine says, and the top alternatives as (token id, logprob)."""

    token: int
    logprob: float | None
    rank: int | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """What a client asked of one turn, in engine-neutral terms: sampling parameters in
    vLLM's names (`max_tokens` always set), the logprobs it returns, its id and priority."""

    sampling: dict[str, Any]
    logprobs: LogprobSpec = LogprobSpec()
    client_rid: str | None = None
    # the client's priority class: a lower class runs first (vLLM's convention; SGLang's
    # higher-first values are negated when parsed)
    priority: int = 0
    routed_experts: bool = False
    stream: bool = False  # the client reads the turn as it goes (`Turn.updates`)


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
    task: asyncio.Task[None] | None = None
    progress_t: float = 0.0  # event-loop time of its attempt's start or last chunk
    attempt_chunks: int = 0  # chunks its current attempt has delivered
    # a streaming client's feed: each chunk, then None once it ended (None: not streamed)
    updates: asyncio.Queue[Any] | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    # ---- reads ---------------------------------------------------------------------------

    def __post_init__(self) -> None:
        if self.request.stream:
            self.updates = asyncio.Queue()

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
        with `error` for the client. Whoever waits on it is woken once."""
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
        if self.updates is not None:
            self.updates.put_nowait(None)
        self.finished.set()
