"""What the cluster service's core hears and what it asks for: typed events in, typed commands
out.

`ClusterCore.handle(event, now)` takes one event and returns the commands that carry out its
decisions. The driver turns HTTP requests, worker-group replies, its watchdog and the node's
sidecar into events and carries out the commands (an operation run on a worker group, a group
torn down or started again, a hint to a node's state manager), in order; a command whose work
ends in an event (`Run` → `StepEnded`, `Teardown` → `TornDown`, ...) is followed by that event
before the next command of the same list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Accepted",
    "Checkpoint",
    "Close",
    "Command",
    "DeleteJob",
    "Dispatch",
    "Ended",
    "Event",
    "Failed",
    "Forget",
    "ForgetNode",
    "Hint",
    "Kill",
    "NodeLost",
    "Ok",
    "Outcome",
    "Park",
    "ParkEnded",
    "RankDied",
    "Restart",
    "Restarted",
    "Run",
    "Settle",
    "Settled",
    "Shutdown",
    "StepEnded",
    "Submit",
    "Teardown",
    "TornDown",
    "Turn",
]


# ---- outcomes of a step on a worker group ----------------------------------------------------


@dataclass(frozen=True)
class Ok:
    """The step ran: its result and how long it took."""

    result: dict[str, Any] | None
    took_s: float


@dataclass(frozen=True)
class Failed:
    """The step failed. `broken`: the group cannot run another operation (a rank died, the
    deadline passed, ranks never came back); `pending`: the ranks that had not answered when
    one raised (they may wait in a collective for it); `no_room`: the node had no room for the
    state the step moves (the state stays where it was: no failure of its job's)."""

    error: str
    broken: bool = False
    pending: tuple[int, ...] = ()
    no_room: bool = False


Outcome = Ok | Failed


# ---- events ----------------------------------------------------------------------------------


class Event:
    """Something the core hears."""


@dataclass(frozen=True)
class Submit(Event):
    """A caller asks for an operation (its payload already checked against the model).
    `estimate_s`: how long it will run, where the caller knows (the simulator); else the
    deployment's measured or profiled duration is the scheduler's estimate."""

    dep: str
    kind: str
    payload: dict[str, Any]
    deadline_s: float | None = None
    estimate_s: float | None = None


@dataclass(frozen=True)
class Turn(Event):
    """A dispatched operation's turn has come: the driver holds its node group."""

    group: int
    op_id: int


@dataclass(frozen=True)
class Park(Event):
    """Offload an idle deployment's state to wait for its turn (the driver holds its group).
    `recover`: tear its group down if the offload breaks it."""

    dep: str
    recover: bool = False


@dataclass(frozen=True)
class StepEnded(Event):
    """A `Run` or `Checkpoint` command ended."""

    op_id: int
    outcome: Outcome


@dataclass(frozen=True)
class Settled(Event):
    """Whether a group's ranks all answered after one raised (`Settle`)."""

    dep: str
    ok: bool


@dataclass(frozen=True)
class TornDown(Event):
    """A deployment's ranks are killed; whether the node's sidecar holds its state whole."""

    dep: str
    state_intact: bool


@dataclass(frozen=True)
class Restarted(Event):
    """A deployment's group started again from its offloaded state, or why it could not."""

    dep: str
    error: str | None = None


@dataclass(frozen=True)
class RankDied(Event):
    """The watchdog found a rank of an idle group dead (the driver holds its group)."""

    dep: str
    why: str


@dataclass(frozen=True)
class NodeLost(Event):
    """A node group's sidecar died and the state it held with it (the driver holds it)."""

    group: int
    why: str


@dataclass(frozen=True)
class DeleteJob(Event):
    job: str


@dataclass(frozen=True)
class Forget(Event):
    """A deleted deployment's running operation has ended: drop it."""

    dep: str


@dataclass(frozen=True)
class Shutdown(Event):
    pass


# ---- commands --------------------------------------------------------------------------------


class Command:
    """Something the core asks the driver to do."""


@dataclass(frozen=True)
class Accepted(Command):
    """A submitted operation is recorded as `op_id` (the caller's answer)."""

    op_id: int


@dataclass(frozen=True)
class Dispatch(Command):
    """Run `op_id` next on `group`: when the driver holds the group, it hears `Turn`."""

    group: int
    op_id: int


@dataclass(frozen=True)
class Run(Command):
    """Run record `op_id` on `dep`'s worker group within `deadline_s` → `StepEnded`."""

    dep: str
    op_id: int
    kind: str
    payload: dict[str, Any]
    deadline_s: float


@dataclass(frozen=True)
class Checkpoint(Command):
    """Write `dep`'s checkpoint from the state its node's sidecar holds → `StepEnded`."""

    dep: str
    op_id: int
    path: str
    deadline_s: float


@dataclass(frozen=True)
class Settle(Command):
    """Give `dep`'s ranks `timeout_s` to answer the operation one of them failed → `Settled`."""

    dep: str
    timeout_s: float


@dataclass(frozen=True)
class Teardown(Command):
    """Kill `dep`'s ranks and ask whether its state is whole on the sidecar → `TornDown`."""

    dep: str
    reason: str


@dataclass(frozen=True)
class Restart(Command):
    """Start `dep`'s ranks again with their state waiting on the sidecar → `Restarted`."""

    dep: str


@dataclass(frozen=True)
class Close(Command):
    """Stop `dep`'s worker group; `keep_state`: its state stays on the sidecar."""

    dep: str
    keep_state: bool = False


@dataclass(frozen=True)
class Kill(Command):
    """Kill `dep`'s ranks now (its running operation then ends failed)."""

    dep: str


@dataclass(frozen=True)
class Hint(Command):
    """A hint to `dep`'s node's state manager (§4.5.1): `plan` (the group's deployments in the
    order they will run) or `prefetch` (bring `dep`'s state up ahead of its switch)."""

    dep: str
    kind: str
    upcoming: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Ended(Command):
    """Operation `op_id` reached its terminal state (wake whoever waits for it)."""

    op_id: int


@dataclass(frozen=True)
class ParkEnded(Command):
    """A `Park` ended: `error` says why the deployment could not be offloaded, if it could not."""

    dep: str
    error: str | None = None


@dataclass(frozen=True)
class ForgetNode(Command):
    """The node group's sidecar is gone: start a new one with its next deployment."""

    group: int
