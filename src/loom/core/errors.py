"""Exceptions shared by every level: a caller's broken contract raises one of these.

The kinds a service answers with are defined once here (`InvalidRequest`, `NotFound`,
`Conflict`, `Unavailable`, ...) and mapped to HTTP status codes in one place,
`http_status`, which every service uses: domain code raises a kind, never a status code.
A client's `ServiceError` is in the family too: `ServiceError.of(status, message, code)` is
also the kind the service named by `code` (`kind_of`), so `except NotFound` catches a 404
whether it was raised here or across the wire.
"""

from __future__ import annotations

from typing import Any, Self

__all__ = [
    "ConfigError",
    "Conflict",
    "InvalidRequest",
    "LoomError",
    "MissingExtraError",
    "NotFound",
    "ServiceError",
    "StorageFull",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "UnknownPolicyError",
    "UpstreamError",
    "http_status",
    "kind_of",
    "status_codes",
]


class LoomError(Exception):
    """Base class of Loom's own errors. `code` names the kind in a service's error body, so
    that a client raises the kind the service raised."""

    code = "error"


class ConfigError(LoomError, ValueError):
    """A configuration or input value is invalid; the message says which and why."""

    code = "invalid"


class InvalidRequest(LoomError, ValueError):
    """A request is malformed or asks for what cannot be done (400)."""

    code = "invalid"


class TooLarge(InvalidRequest):
    """A request is larger than the service takes (413)."""

    code = "too_large"


class Unauthorized(LoomError):
    """The request lacks the service's token (401)."""

    code = "unauthorized"


class NotFound(LoomError, KeyError):
    """What the request names does not exist (404)."""

    code = "not_found"

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "not found"


class Conflict(LoomError):
    """The request contradicts the service's state (409)."""

    code = "conflict"


class StorageFull(LoomError):
    """Storing it would pass the service's memory cap; nothing was stored (507)."""

    code = "storage_full"


class Unavailable(LoomError):
    """The service cannot serve it now: no worker, shutting down (503)."""

    code = "unavailable"


class UpstreamError(LoomError):
    """A backend the service relies on failed (502); `status` relays a backend's own 4xx."""

    code = "upstream"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class UnknownPolicyError(LoomError, KeyError):
    """A policy name is not registered."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "unknown policy"


class MissingExtraError(LoomError, ImportError):
    """A command needs an optional extra that is not installed: the message names the command,
    the extra, the module missing and the line that installs it."""

    code = "missing_extra"

    def __init__(
        self, command: str, extra: str, module: str, install: str, instead: str | None = None
    ) -> None:
        super().__init__(command, extra, module, install, instead)
        self.command = command
        self.extra = extra
        self.module = module
        self.install = install
        self.instead = instead

    def __str__(self) -> str:
        return (
            f"{self.command} needs Loom's {self.extra!r} extra ({self.module} is not "
            f"installed); install it from your Loom checkout: {self.install}"
            + (f"; {self.instead}" if self.instead else "")
        )


class ServiceError(LoomError, RuntimeError):
    """A Loom service refused or failed a request: its HTTP `status`, its `message` and the
    `code` of the kind it named. Build one with `of`, which makes it that kind as well."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(f"{status}: {message}")
        # NOTE: after super(): UpstreamError's __init__ (a kind mixed in by `of`) sets status
        self.status = status
        self.message = message
        if code is not None:
            self.code = code

    @classmethod
    def of(cls, status: int, message: str, code: str | None = None) -> Self:
        """`cls(status, message, code)`, and also an instance of the kind `code` names (so a
        client's 404 is a `NotFound`); only `cls` where the code is no known kind."""
        kind = kind_of(code)
        if kind is None:
            return cls(status, message, code)
        mixed = _MIXED.get((cls, kind))
        if mixed is None:
            name = f"{cls.__name__}[{kind.__name__}]"
            mixed = _MIXED[cls, kind] = type(name, (cls, kind), {"__module__": cls.__module__})
        made: Self = mixed(status, message, code)
        return made


_MIXED: dict[tuple[type[ServiceError], type[LoomError]], type[Any]] = {}


# the kinds a service names in its error body, by `code` (one class per code)
_KINDS: dict[str, type[LoomError]] = {
    k.code: k
    for k in (
        InvalidRequest,
        TooLarge,
        Unauthorized,
        NotFound,
        Conflict,
        StorageFull,
        Unavailable,
        UpstreamError,
    )
}


def kind_of(code: str | None) -> type[LoomError] | None:
    """The error kind a service's `code` names; None for a code that names none."""
    return _KINDS.get(code) if code is not None else None


_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (TooLarge, 413),
    (InvalidRequest, 400),
    (ConfigError, 400),
    (Unauthorized, 401),
    (NotFound, 404),
    (UnknownPolicyError, 400),
    (Conflict, 409),
    (StorageFull, 507),
    (Unavailable, 503),
)


def status_codes() -> dict[int, str]:
    """The code of the kind each status stands for (the first kind mapped to it)."""
    out: dict[int, str] = {502: UpstreamError.code}
    for kind, status in _STATUS:
        out.setdefault(status, getattr(kind, "code", LoomError.code))
    return out


def http_status(exc: BaseException) -> int:
    """The HTTP status a service answers `exc` with: 500 for what is no Loom error kind."""
    if isinstance(exc, UpstreamError):
        return exc.status or 502
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return 500
