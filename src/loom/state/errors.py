"""The state's one error family: every refusal of the StateManager or its sidecar is a
`StateError` and a `LoomError` kind (so `http_status` maps it), named on the wire by `code`."""

from __future__ import annotations

from typing import Any

from loom.core.errors import (
    ConfigError,
    Conflict,
    InvalidRequest,
    LoomError,
    NotFound,
    StorageFull,
    Unauthorized,
)

__all__ = [
    "BadMessage",
    "InvalidCall",
    "NotResident",
    "StateError",
    "TierFull",
    "Unauthenticated",
    "UnknownDeployment",
    "error_class",
]


class StateError(LoomError, RuntimeError):
    """The StateManager or its sidecar refused or failed a call (its message says why)."""

    code = "state"

    @classmethod
    def from_wire(cls, message: str) -> StateError:
        """The error as a client raises it from the sidecar's answer: its class, its message."""
        return cls(message)


class BadMessage(StateError, InvalidRequest):
    """A message the sidecar cannot take: garbage bytes, an unknown call, a malformed call
    or another version of the wire."""

    code = "bad_message"


class Unauthenticated(StateError, Unauthorized):
    """The peer refused our token, or did not prove it knows it (or is no Loom sidecar)."""

    code = "unauthenticated"


class InvalidCall(StateError, ConfigError):
    """A well-formed call the state refuses: a rank twice, a GPU the node lacks, ..."""

    code = "invalid_call"


class UnknownDeployment(StateError, NotFound):
    """A call names a deployment (or a rank of one) the node does not hold."""

    code = "not_found"


class NotResident(StateError, Conflict):
    """A deployment's state was read while not on its devices."""

    code = "not_resident"


class TierFull(StateError, StorageFull):
    """A put would take a tier past its capacity; nothing was put."""

    code = "tier_full"

    def __init__(self, tier: Any, need: int, free: int, note: str = "") -> None:
        super().__init__(
            f"{tier} tier: {need} bytes asked, {free} free" + (f" ({note})" if note else "")
        )
        self.tier: Any = tier
        self.need: int | None = need
        self.free: int | None = free

    @classmethod
    def from_wire(cls, message: str) -> StateError:
        exc = cls.__new__(cls)
        Exception.__init__(exc, message)
        exc.tier, exc.need, exc.free = None, None, None
        return exc


_BY_CODE: dict[str, type[StateError]] = {
    cls.code: cls
    for cls in (
        StateError,
        BadMessage,
        Unauthenticated,
        InvalidCall,
        UnknownDeployment,
        NotResident,
        TierFull,
    )
}


def error_class(code: str) -> type[StateError]:
    """The class a wire error code names (an unknown code: `StateError`)."""
    return _BY_CODE.get(code, StateError)


def error_code(exc: BaseException) -> str:
    """The code `exc` crosses the wire with: its own, or the family member it fits."""
    if isinstance(exc, StateError):
        return exc.code
    if isinstance(exc, ConfigError):
        return InvalidCall.code
    if isinstance(exc, KeyError):
        return UnknownDeployment.code
    return StateError.code
