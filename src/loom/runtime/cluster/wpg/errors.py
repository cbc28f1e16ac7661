"""The errors of a worker-process group, one family under `WorkerError` (a `LoomError`): a
rank that raised, a group that cannot go on, a message that is not one of the group's."""

from __future__ import annotations

from enum import StrEnum

from loom.core.errors import LoomError, Unavailable

__all__ = ["BadMessage", "FailureKind", "GroupBroken", "RankFailed", "WorkerError"]


class FailureKind(StrEnum):
    """What a rank says went wrong when it answers with a failure."""

    RAISED = "raised"  # the operation raised (any exception of the rank's)
    REFUSED = "refused"  # the input cannot be run as given (a `ConfigError` in the rank)
    NO_ROOM = "no_room"  # its node had no room for the state it moves (a `StorageFull`)
    BAD_MESSAGE = "bad_message"  # the rank could not decode what it was sent (`BadMessage`)


class WorkerError(LoomError, RuntimeError):
    """An operation failed in a worker (its message says which rank and why): a server-side
    failure (500), not the caller's."""

    code = "worker_failed"


class RankFailed(WorkerError):
    """A rank raised; `pending` are the ranks that had not answered yet (they may be waiting
    in a collective for the one that raised). `error` names the exception the rank raised
    (its class name), `kind` what kind of failure the rank answered."""

    code = "rank_failed"

    def __init__(
        self,
        message: str,
        pending: frozenset[int],
        *,
        error: str = "",
        kind: FailureKind = FailureKind.RAISED,
    ) -> None:
        super().__init__(message)
        self.pending = pending
        self.error = error
        self.kind = kind


class GroupBroken(WorkerError, Unavailable):
    """The group cannot run another operation: a rank died, an operation ran past its
    deadline, ranks never came back from one, or a rank answered what is no message of the
    group's. Kill it. The deployment is unavailable (503) until it is started again."""

    code = Unavailable.code


class BadMessage(WorkerError):
    """Bytes that do not decode to the message expected there: malformed, of another
    version, of the wrong kind, or naming an unknown operation. `data` is the start of the
    bytes received (to name them in a log)."""

    code = "bad_message"

    def __init__(self, message: str, data: bytes = b"") -> None:
        super().__init__(message)
        self.data = data
