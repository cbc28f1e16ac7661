"""The shared layer's adapters for the FastAPI services (ASGI): the token check and the body
limit as middleware, and every error (Loom's kinds, FastAPI's validation) answered by
`loom.runtime.web.errors.render`."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loom.core.errors import InvalidRequest, LoomError
from loom.runtime.web.auth import refusal
from loom.runtime.web.errors import ErrorShape, Rendered, render
from loom.runtime.web.limits import too_large
from loom.runtime.web.probes import METRICS_CONTENT_TYPE, exposition

__all__ = [
    "BearerToken",
    "BodyLimit",
    "add_error_handlers",
    "error_response",
    "loom_error",
    "malformed_request",
    "metrics_response",
    "validation_message",
]


def error_response(rendered: Rendered) -> JSONResponse:
    return JSONResponse(rendered.body, rendered.status, headers=rendered.headers or None)


def metrics_response(registry: Any) -> Response:
    """`GET /metrics` of a Prometheus registry."""
    return Response(exposition(registry), media_type=METRICS_CONTENT_TYPE)


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is a 413, whether its Content-Length
    says so up front or a chunked body grows past it. `hint` names the setting to raise."""

    def __init__(self, app: ASGIApp, max_bytes: int, hint: str = "--max-body-bytes") -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.hint = hint

    def _too_large(self) -> JSONResponse:
        return error_response(render(too_large(self.max_bytes, self.hint)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large()(scope, receive, send)
            return
        seen = 0
        refused = False

        async def counted() -> Message:
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # NOTE: answered here, as the body grows: an exception would reach
                    # FastAPI's body parsing, which turns any error into a 400
                    refused = True
                    await self._too_large()(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Message) -> None:
            if not refused:  # the app's own answer, after ours, goes nowhere
                await send(message)

        await self.app(scope, counted, guarded)


class BearerToken:
    """ASGI middleware: every HTTP request but health and metrics (`open_health`; all of them
    without it) must carry `Authorization: Bearer <token>`: 401 otherwise
    (`loom.runtime.web.auth.refusal`, the aiohttp services' check too)."""

    def __init__(self, app: ASGIApp, token: str, open_health: bool = True) -> None:
        self.app = app
        self.token = token
        self.open_health = open_health

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"authorization")
            refused = refusal(scope["path"], header, self.token, self.open_health)
            if refused is not None:
                await error_response(render(refused))(scope, receive, send)
                return
        await self.app(scope, receive, send)


def validation_message(errors: Any) -> str:
    """Where and what for each validation error, never the bad value."""
    # NOTE: FastAPI's own handler echoes each bad input, and a NaN or an infinity echoed
    # is not JSON: the response fails and the connection drops. Say what was wrong only.
    parts = []
    for e in errors:
        where = ".".join(map(str, e.get("loc", ())))
        parts.append(f"{where}: {e.get('msg', '')}" if where else str(e.get("msg", "")))
    return "; ".join(parts) or "invalid request"


async def malformed_request(request: Request, exc: Exception) -> JSONResponse:
    """A request FastAPI could not validate (malformed JSON included) is bad input like any
    other: an `InvalidRequest` (400, as every Loom service answers bad input)."""
    assert isinstance(exc, RequestValidationError)
    return error_response(render(InvalidRequest(validation_message(exc.errors()))))


async def loom_error(request: Request, exc: Exception) -> JSONResponse:
    """A Loom error kind, answered with its status and code (`render`)."""
    assert isinstance(exc, LoomError)
    return error_response(render(exc, ErrorShape.LOOM))


def add_error_handlers(app: FastAPI) -> None:
    """The error mapping every FastAPI service uses: bad input and Loom's error kinds."""
    app.add_exception_handler(RequestValidationError, malformed_request)
    app.add_exception_handler(LoomError, loom_error)
