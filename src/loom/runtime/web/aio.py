"""The shared layer's adapters for the aiohttp services (the router, the emulated engine): the
token check and every error (Loom's kinds, aiohttp's own 404/405/413) as middleware answered by
`loom.runtime.web.errors.render`, the JSON body read, and health and metrics responses."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from loom.core.errors import LoomError
from loom.runtime.web.auth import refusal
from loom.runtime.web.errors import ErrorShape, Rendered, code_for_status, render, render_message
from loom.runtime.web.limits import json_object, too_large
from loom.runtime.web.probes import METRICS_CONTENT_TYPE, exposition

__all__ = [
    "Handler",
    "auth_middleware",
    "error_middleware",
    "error_response",
    "json_object",
    "json_response",
    "metrics_response",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def error_response(rendered: Rendered) -> web.Response:
    resp = json_response(rendered.body, rendered.status)
    resp.headers.update(rendered.headers)
    return resp


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """`GET /metrics` of a Prometheus registry."""
    return web.Response(body=exposition(registry), headers={"Content-Type": METRICS_CONTENT_TYPE})


def error_middleware(
    shape: ErrorShape,
    *,
    max_bytes: int,
    hint: str,
    on_error: Callable[[int], None] | None = None,
) -> Any:
    """Middleware: a Loom error kind, a body over `max_bytes` (aiohttp's `client_max_size`)
    and aiohttp's own refusals answered in `shape`; `on_error(status)` counts each 4xx/5xx.
    What is no Loom kind is a bug: it propagates (aiohttp's 500)."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            resp = await handler(request)
        except web.HTTPRequestEntityTooLarge:
            resp = error_response(render(too_large(max_bytes, hint), shape))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            resp = error_response(
                render_message(exc.reason, exc.status, code_for_status(exc.status), shape)
            )
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except LoomError as exc:
            resp = error_response(render(exc, shape))
        if on_error is not None and resp.status >= 400:
            on_error(resp.status)
        return resp

    return errors


def auth_middleware(token: str, open_health: bool) -> Any:
    """Middleware: every request but health and metrics carries `token` (`refusal`)."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = refusal(request.path, request.headers.get("Authorization"), token, open_health)
        if refused is not None:
            raise refused
        return await handler(request)

    return auth
