"""What the clients share: an error that carries the service's status and message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from loom.core.errors import ServiceError  # defined there so services can raise it too

__all__ = ["ServiceError", "checked"]


def checked(
    resp: httpx.Response,
    error: Callable[[int, str], ServiceError],
    message_of: Callable[[Any], str],
) -> Any:
    """The response's JSON, or `error(status, message)` with the message `message_of(body)`
    finds in a 4xx/5xx body (the raw text when the body is not what it expects). `error` is
    a `ServiceError` subclass, or a function choosing one (by the body, say)."""
    if resp.status_code >= 400:
        try:
            message = message_of(resp.json())
        except (ValueError, KeyError, TypeError):
            message = resp.text[:500]
        raise error(resp.status_code, message)
    return resp.json()
