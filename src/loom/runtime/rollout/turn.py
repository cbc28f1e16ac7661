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

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from loom.core.errors import Conflict

__all__ = [
    "TRANSITIONS",
    "Delta",
    "Done",
    "EngineLoad",
    "Key",
    "LogprobSpec",
    "PromptLogprob",
    "TokenLogprob",
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


class TurnStateError(Conflict, RuntimeError):
    """A state change the turn lifecycle does not allow (a bug in the caller; 409 should one
    reach a response)."""


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


@dataclass(frozen=True, slots=True)
class Delta:
    """A chunk of an attempt's stream: its new tokens, their text and logprobs."""

    tokens: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None  # one per token, when asked
    prompt_logprobs: list[PromptLogprob] | None = None  # once, when asked


@dataclass(frozen=True, slots=True)
class Done:
    """How an attempt ended, as its engine said."""

    finish_reason: str  # "stop", "length" or "abort"
    matched_stop: int | str | None = None
    cached_tokens: int = 0
    message: str | None = None  # an abort's reason, as the engine gave it
    routed_experts: Any = None


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine says of its load: requests running and waiting in its own queue (of
    every client, not only the router's), the share of its KV cache in use, and how many
    requests it runs at once where it says."""

    running: int
    waiting: int
    kv_usage: float | None = None
    max_running: int | None = None
