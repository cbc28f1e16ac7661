"""Exceptions shared by every level: a caller's broken contract raises one of these.

The kinds a service answers with are defined once here (`InvalidRequest`, `NotFound`,
`Conflict`, `Unavailable`, ...) and mapped to HTTP status codes in one place,
`http_status`, which every service uses: domain code raises a kind, never a status code.
"""

from __future__ import annotations

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


class ServiceError(RuntimeError):
    """A Loom service refused or failed a request: its HTTP `status` and its `message`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


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


def http_status(exc: BaseException) -> int:
    """The HTTP status a service answers `exc` with: 500 for what is no Loom error kind."""
    if isinstance(exc, UpstreamError):
        return exc.status or 502
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return 500
