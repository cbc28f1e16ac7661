"""What a weight store refuses, as one exception family shared by the in-memory store, the
relay service and its client: each is one of Loom's error kinds (`loom.core.errors`, which maps
kinds to HTTP statuses for every service) and carries a `code` the response body names, so the
client raises the very class the store raised."""

from __future__ import annotations

from typing import ClassVar

from loom.core.errors import (
    Conflict,
    InvalidRequest,
    LoomError,
    NotFound,
    StorageFull,
    Unavailable,
    http_status,
)

__all__ = [
    "ERRORS",
    "InvalidRequestError",
    "ObjectMissingError",
    "RelayError",
    "RelayUnreachableError",
    "StoreFullError",
    "UnknownMemberError",
    "UnknownVersionError",
    "VersionConflictError",
    "VersionNeededError",
    "error_for",
]


class RelayError(LoomError):
    """A weight store refused or failed a request."""

    CODE: ClassVar[str] = "relay_error"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self._status = status

    def __str__(self) -> str:
        return self.message

    @property
    def status(self) -> int:
        """The HTTP status the relay answers it with (or answered, for the client)."""
        return self._status if self._status is not None else http_status(self)


class InvalidRequestError(RelayError, InvalidRequest):
    """A malformed key, version, member id or role (the caller's broken contract)."""

    CODE = "invalid"


class ObjectMissingError(RelayError, NotFound):
    """No object under a key (or, for a batch, under some of its keys)."""

    CODE = "object_missing"


class UnknownVersionError(RelayError, NotFound):
    """No object of that version is stored."""

    CODE = "unknown_version"


class UnknownMemberError(RelayError, NotFound):
    """No live member by that id."""

    CODE = "unknown_member"


class VersionConflictError(RelayError, Conflict):
    """A key is stored under another version: delete it first (objects never change version)."""

    CODE = "version_conflict"


class VersionNeededError(RelayError, Conflict):
    """A version some live member may still need cannot be dropped."""

    CODE = "version_needed"


class StoreFullError(RelayError, StorageFull):
    """Storing the object would pass the store's memory cap; nothing was stored."""

    CODE = "store_full"


class RelayUnreachableError(RelayError, Unavailable):
    """The relay did not answer, or the connection broke before a whole answer came (raised by
    the client only; nothing can be assumed stored or read)."""

    CODE = "unreachable"


ERRORS: dict[str, type[RelayError]] = {
    cls.CODE: cls
    for cls in (
        InvalidRequestError,
        ObjectMissingError,
        UnknownVersionError,
        UnknownMemberError,
        VersionConflictError,
        VersionNeededError,
        StoreFullError,
        RelayUnreachableError,
    )
}


def error_for(code: str | None, status: int, message: str) -> RelayError:
    """The exception a relay response stands for: by its body's `error` code, else generic."""
    cls = ERRORS.get(code or "", RelayError)
    return cls(message, status)
