"""The request body: one refusal for a body over the limit, one reading of a JSON object,
whoever serves it."""

from __future__ import annotations

from typing import Any

import orjson

from loom.core.errors import InvalidRequest, TooLarge

__all__ = ["json_object", "too_large"]


def too_large(max_bytes: int, hint: str) -> TooLarge:
    """What a body over `max_bytes` is answered with (413); `hint` names the setting."""
    return TooLarge(f"request body over the limit of {max_bytes} bytes ({hint})")


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object; `InvalidRequest` saying what is wrong."""
    if not raw:
        raise InvalidRequest("the request needs a JSON body")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    return body
