"""The token check of every service, whatever serves it: one function, used by the ASGI and the
aiohttp middleware (`loom.runtime.access` holds the rule)."""

from __future__ import annotations

from loom.core.errors import Unauthorized
from loom.runtime.access import UNAUTHORIZED, authorized, is_open

__all__ = ["refusal"]


def refusal(
    path: str, header: str | bytes | None, token: str | None, open_health: bool
) -> Unauthorized | None:
    """Why a request to `path` with `Authorization: header` is refused; None: let it in."""
    if token is None or is_open(path, open_health) or authorized(header, token):
        return None
    return Unauthorized(UNAUTHORIZED)
