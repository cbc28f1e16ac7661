"""What the clients share: an error that carries the service's status and message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

__all__ = ["ServiceError", "checked"]


class ServiceError(RuntimeError):
    """A Loom service refused or failed a request: its HTTP `status` and its `message`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def checked(
    resp: httpx.Response, error: type[ServiceError], message_of: Callable[[Any], str]
) -> Any:
    """The response's JSON, or `error` with the message `message_of(body)` finds in a 4xx/5xx
    body (the raw text when the body is not what it expects)."""
    if resp.status_code >= 400:
        try:
            message = message_of(resp.json())
        except (ValueError, KeyError, TypeError):
            message = resp.text[:500]
        raise error(resp.status_code, message)
    return resp.json()
