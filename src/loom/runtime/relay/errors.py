"""What a weight store refuses, as one exception family shared by the in-memory store, the
relay service and its client: each kind carries the HTTP status the relay answers it with and
a `code` the response body names, so the client raises the very class the store raised."""

from __future__ import annotations

from typing import ClassVar

from loom.core.errors import ServiceError

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


class RelayError(ServiceError):
    """A weight store refused or failed a request; `status` is the relay's HTTP status."""

    STATUS: ClassVar[int] = 500
    CODE: ClassVar[str] = "relay_error"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(self.STATUS if status is None else status, message)


class InvalidRequestError(RelayError):
    """A malformed key, version, member id or role (the caller's broken contract)."""

    STATUS = 422
    CODE = "invalid"


class ObjectMissingError(RelayError):
    """No object under a key (or, for a batch, under some of its keys)."""

    STATUS = 404
    CODE = "object_missing"


class UnknownVersionError(RelayError):
    """No object of that version is stored."""

    STATUS = 404
    CODE = "unknown_version"


class UnknownMemberError(RelayError):
    """No live member by that id."""

    STATUS = 404
    CODE = "unknown_member"


class VersionConflictError(RelayError):
    """A key is stored under another version: delete it first (objects never change version)."""

    STATUS = 409
    CODE = "version_conflict"


class VersionNeededError(RelayError):
    """A version some live member may still need cannot be dropped."""

    STATUS = 409
    CODE = "version_needed"


class StoreFullError(RelayError):
    """Storing the object would pass the store's memory cap; nothing was stored."""

    STATUS = 507
    CODE = "store_full"


class RelayUnreachableError(RelayError):
    """The relay did not answer, or the connection broke before a whole answer came (raised by
    the client only; nothing can be assumed stored or read)."""

    STATUS = 503
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
