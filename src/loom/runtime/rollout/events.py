"""What the router's core hears and what it asks for: typed events in, typed commands out.

`RouterCore.handle(event, now)` takes one event and returns the commands that carry out its
decisions. The driver turns engine streams, health checks, load reports, HTTP requests and
its timer into events, and carries out the commands (an attempt started or stopped, an
engine probed, a prediction made, a waiter woken); the simulator does the same with
simulated engines and time. Neither holds a decision of its own.

Events that arrive while the core works on another are never handled inside it: the core
queues what an event causes (an engine with room, turns to offer) and handles it in order
before `handle` returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loom.runtime.rollout.turn import Delta, Done, EngineLoad, TurnRequest

if TYPE_CHECKING:
    from loom.runtime.rollout.state import EngineState, Trajectory, Turn

__all__ = [
    "Abandon",
    "Abort",
    "AttemptDone",
    "AttemptFailed",
    "AttemptRejected",
    "BatchEntry",
    "Chunk",
    "Command",
    "Declare",
    "EndTrajectory",
    "EngineAdded",
    "EngineDown",
    "EngineLoaded",
    "EngineRemoved",
    "EngineTakenBack",
    "EngineUp",
    "Event",
    "Health",
    "KvMoved",
    "MoveKv",
    "Predict",
    "Predicted",
    "PriorityRefused",
    "Probe",
    "Probed",
    "Record",
    "Reply",
    "Report",
    "Shutdown",
    "Start",
    "Stop",
    "Stream",
    "Submit",
    "Suspect",
    "Tick",
    "TurnEnded",
    "WakeAt",
    "WeightsSet",
]


@dataclass(frozen=True)
class BatchEntry:
    """One trajectory of a declared batch."""

    id: str
    prompt_id: int
    prompt_tokens: int = 0
    group: str | None = None


# ---- events --------------------------------------------------------------------------------


class Event:
    """What the core hears. Each kind has one handler in `RouterCore`."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Submit(Event):
    """A request of trajectory `key` (None: a one-request trajectory of its own): `n` turns
    sharing `prompt`. Replies with the turns."""

    key: str | None
    prompt: list[int]
    request: TurnRequest
    n: int = 1
    prompt_id: int | None = None


@dataclass(frozen=True, slots=True)
class Declare(Event):
    """A batch before it starts, with each entry's predicted length (None: the prior).
    Replies with each trajectory's planned engine id ("" where none is planned)."""

    entries: Sequence[BatchEntry]
    predicted: Sequence[float] | None = None


@dataclass(frozen=True, slots=True)
class EndTrajectory(Event):
    """The client says trajectory `key` has ended. Replies with it."""

    key: str


@dataclass(frozen=True, slots=True)
class Chunk(Event):
    """A chunk of `turn`'s attempt number `attempt`."""

    turn: Turn
    attempt: int
    delta: Delta


@dataclass(frozen=True, slots=True)
class AttemptDone(Event):
    """`turn`'s attempt `attempt` ended at its engine (stop, length or the engine's abort)."""

    turn: Turn
    attempt: int
    done: Done


@dataclass(frozen=True, slots=True)
class AttemptFailed(Event):
    """`turn`'s attempt at `engine` failed: the engine is out (`down`: it refused the
    connection) or may be (a 5xx, a broken stream, a deadline: its health decides)."""

    turn: Turn
    attempt: int
    engine: EngineState
    reason: str
    down: bool = False


@dataclass(frozen=True, slots=True)
class AttemptRejected(Event):
    """The engine refused `turn`'s request itself (a 4xx): the client hears `error`."""

    turn: Turn
    attempt: int
    error: Exception


@dataclass(frozen=True, slots=True)
class PriorityRefused(Event):
    """The engine refused the `priority` field of `turn`'s attempt (`error`, its answer)."""

    turn: Turn
    attempt: int
    error: Exception


@dataclass(frozen=True, slots=True)
class EngineAdded(Event):
    """A probed engine joins. Replies with it."""

    engine: EngineState


@dataclass(frozen=True, slots=True)
class EngineRemoved(Event):
    """Drain engine `key` (its id or url): `force` aborts its running turns and resumes them
    elsewhere now; `leaving`: its launcher stops it next, whatever the answer. Replies with
    it."""

    key: str
    force: bool = False
    leaving: bool = False


@dataclass(frozen=True, slots=True)
class EngineTakenBack(Event):
    """A draining engine registered again (its launcher restarted it at the same url)."""

    engine: EngineState


@dataclass(frozen=True, slots=True)
class EngineDown(Event):
    """`engine` failed (a refused connection, its health checks)."""

    engine: EngineState
    reason: str


@dataclass(frozen=True, slots=True)
class EngineUp(Event):
    """`engine`, out, answers its health check again."""

    engine: EngineState


@dataclass(frozen=True, slots=True)
class Health(Event):
    """One round of health checks: whether each engine answered."""

    results: Sequence[tuple[EngineState, bool]]


@dataclass(frozen=True, slots=True)
class Suspect(Event):
    """A call to `engine` failed: its health is checked now."""

    engine: EngineState
    reason: str


@dataclass(frozen=True, slots=True)
class Probed(Event):
    """The health check a `Probe` asked for answered (`ok`) or not."""

    engine: EngineState
    ok: bool
    reason: str


@dataclass(frozen=True, slots=True)
class EngineLoaded(Event):
    """`engine` reported its load."""

    engine: EngineState
    load: EngineLoad


@dataclass(frozen=True, slots=True)
class WeightsSet(Event):
    """Weights of `version` are current; `engines` (ids) serve them already. Replies with the
    ids of the engines behind."""

    version: int
    engines: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class Report(Event):
    """What an engine's side says of it (the weight version it loaded; a lent engine's room
    and serving slack). Replies with the engine."""

    key: str
    version: int | None = None
    free_tokens: int | None = None
    slack_s: float | None = None


@dataclass(frozen=True, slots=True)
class Abort(Event):
    """End the turns of these client request ids (or all, `everything`) with what they
    generated, marked abort. Replies with how many ended."""

    rids: Sequence[str] = ()
    everything: bool = False


@dataclass(frozen=True, slots=True)
class Abandon(Event):
    """The client of `turns` went away."""

    turns: Sequence[Turn]


@dataclass(frozen=True, slots=True)
class Predicted(Event):
    """A `Predict` answered: `trajectory`'s predicted total, made after `steps` turns."""

    trajectory: Trajectory
    steps: int
    total: float


@dataclass(frozen=True, slots=True)
class Tick(Event):
    """Time passed: what is due (aging, stalled attempts, idle trajectories) is done.
    Replies with nothing; a `WakeAt` says when the next is due."""


@dataclass(frozen=True, slots=True)
class KvMoved(Event):
    """The KV copy of `trajectory`'s context from `src` to `dst` ended: `tokens` of it
    arrived (0 where it failed, with `error` saying why) in `seconds` (the engines')."""

    trajectory: Trajectory
    src: EngineState
    dst: EngineState
    tokens: int
    seconds: float = 0.0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Shutdown(Event):
    """Stop: every turn in flight ends with `reason` for its client."""

    reason: str = "the router is shutting down"


# ---- commands ------------------------------------------------------------------------------


class Command:
    """What the core asks its driver to do."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Reply(Command):
    """The answer to the event that was handled (first of the commands)."""

    value: Any


@dataclass(frozen=True, slots=True)
class Start(Command):
    """Start `turn`'s attempt number `attempt` at `engine`: prompt + generated so far, the
    tokens still missing (`Turn.attempt_sampling`), with `priority` where not None."""

    turn: Turn
    engine: EngineState
    attempt: int
    priority: int | None


@dataclass(frozen=True, slots=True)
class Stop(Command):
    """Stop `turn`'s attempt at `engine` (its stream closes); `tell`: and abort request
    `rid` there."""

    turn: Turn
    engine: EngineState
    rid: str
    tell: bool


@dataclass(frozen=True, slots=True)
class Probe(Command):
    """Check `engine`'s health now; answer with `Probed`."""

    engine: EngineState
    reason: str


@dataclass(frozen=True, slots=True)
class Predict(Command):
    """Predict `trajectory`'s total anew (it is in a tool call); answer with `Predicted`."""

    trajectory: Trajectory


@dataclass(frozen=True, slots=True)
class MoveKv(Command):
    """Copy the KV `src` holds of `trajectory`'s context (`tokens`) to `dst`; answer with
    `KvMoved`."""

    trajectory: Trajectory
    src: EngineState
    dst: EngineState
    tokens: list[int]


@dataclass(frozen=True, slots=True)
class Record(Command):
    """`trajectory` ended: the predictor learns from it."""

    trajectory: Trajectory


@dataclass(frozen=True, slots=True)
class TurnEnded(Command):
    """`turn` ended (finished or failed): wake whoever waits on it."""

    turn: Turn


@dataclass(frozen=True, slots=True)
class Stream(Command):
    """A streamed turn's chunk, for its client."""

    turn: Turn
    delta: Delta


@dataclass(frozen=True, slots=True)
class WakeAt(Command):
    """Send a `Tick` at `at` (the core's time) or before."""

    at: float
