"""What every route of an emulated engine shares: JSON bodies in, vLLM-shaped answers out, and
errors rendered by the shared web layer in OpenAI's shape (`loom.runtime.web`)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from loom.core.errors import InvalidRequest, LoomError
from loom.runtime.web.aio import error_response, json_response
from loom.runtime.web.errors import ErrorShape, render
from loom.runtime.web.limits import json_object

__all__ = ["SHAPE", "bad", "json_response", "read_body"]

SHAPE = ErrorShape.OPENAI  # what vLLM's OpenAI server answers, and its clients parse


def bad(error: LoomError | str) -> web.Response:
    """An error kind (a message alone: `InvalidRequest`) as vLLM's OpenAI server answers it."""
    exc = InvalidRequest(error) if isinstance(error, str) else error
    return error_response(render(exc, SHAPE))


async def read_body(request: web.Request, fields: frozenset[str] | None = None) -> dict[str, Any]:
    """The request's JSON object; InvalidRequest saying what is wrong with it otherwise. With
    `fields`, the route honours those only, and any other is refused by name."""
    body = json_object(await request.read())
    if fields is not None and not body.keys() <= fields:
        unknown = ", ".join(sorted(map(repr, body.keys() - fields)))
        raise InvalidRequest(
            f"unknown fields {unknown}; this route takes {', '.join(sorted(fields))}"
        )
    return body
