"""Exceptions shared by every level: a caller's broken contract raises one of these."""

from __future__ import annotations

__all__ = ["ConfigError", "LoomError", "ServiceError", "UnknownPolicyError"]


class LoomError(Exception):
    """Base class of Loom's own errors."""


class ConfigError(LoomError, ValueError):
    """A configuration or input value is invalid; the message says which and why."""


class UnknownPolicyError(LoomError, KeyError):
    """A policy name is not registered."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "unknown policy"


class ServiceError(RuntimeError):
    """A Loom service refused or failed a request: its HTTP `status` and its `message`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
