"""What every route of an emulated engine shares: JSON bodies in, vLLM-shaped answers and
errors out."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from loom.core.errors import InvalidRequest

__all__ = ["bad", "json_response", "read_body"]


def bad(message: str, status: int = 400) -> web.Response:
    """An error as vLLM's OpenAI server answers it."""
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": status}},
        status=status,
        dumps=lambda v: orjson.dumps(v).decode(),
    )


def json_response(value: Any) -> web.Response:
    return web.Response(body=orjson.dumps(value), content_type="application/json")


async def read_body(request: web.Request, fields: frozenset[str] | None = None) -> dict[str, Any]:
    """The request's JSON object; InvalidRequest saying what is wrong with it otherwise. With
    `fields`, the route honours those only, and any other is refused by name."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    if fields is not None and not body.keys() <= fields:
        unknown = ", ".join(sorted(map(repr, body.keys() - fields)))
        raise InvalidRequest(
            f"unknown fields {unknown}; this route takes {', '.join(sorted(fields))}"
        )
    return body
