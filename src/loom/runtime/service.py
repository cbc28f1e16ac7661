"""What Loom's FastAPI services share: the loopback rule, a bearer token and a body limit as
ASGI middleware, a 422 handler that never echoes bad input, and running the app under uvicorn
on a socket bound first (so `--port 0` can say which port it got)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Self

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loom.core.errors import InvalidRequest, LoomError, TooLarge, Unauthorized, http_status
from loom.core.lifecycle import Started
from loom.runtime.access import UNAUTHORIZED, authorized, is_loopback, is_open

__all__ = [
    "GRACEFUL_S",
    "BackgroundApp",
    "BackgroundService",
    "BearerToken",
    "BodyLimit",
    "DriverServer",
    "add_error_handlers",
    "bind",
    "is_loopback",
    "loom_error",
    "malformed_request",
    "run_app",
    "uvicorn_config",
]

GRACEFUL_S = 5.0  # open requests get this long to finish when a server stops


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is a 413, whether its Content-Length
    says so up front or a chunked body grows past it. `hint` names the setting to raise."""

    def __init__(self, app: ASGIApp, max_bytes: int, hint: str = "--max-body-bytes") -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.hint = hint

    def _too_large(self) -> JSONResponse:
        exc = TooLarge(f"request body over {self.max_bytes} bytes ({self.hint})")
        return JSONResponse(
            status_code=http_status(exc), content={"detail": str(exc), "error": exc.code}
        )

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
    without it) must carry `Authorization: Bearer <token>`: 401 otherwise (`loom.runtime.
    access`'s rule, the router's too)."""

    def __init__(self, app: ASGIApp, token: str, open_health: bool = True) -> None:
        self.app = app
        self.token = token
        self.open_health = open_health

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not is_open(scope["path"], self.open_health):
            given = dict(scope["headers"]).get(b"authorization")
            if not authorized(given, self.token):
                exc = Unauthorized(UNAUTHORIZED)
                response = JSONResponse(
                    status_code=http_status(exc),
                    content={"detail": str(exc), "error": exc.code},
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def malformed_request(request: Request, exc: Exception) -> JSONResponse:
    """A request FastAPI could not validate is bad input like any other (400, as every Loom
    service answers bad input): where and what, never the bad value."""
    # NOTE: FastAPI's own handler echoes each bad input, and a NaN or an infinity echoed
    # is not JSON: the response fails and the connection drops. Say what was wrong only.
    assert isinstance(exc, RequestValidationError)
    detail = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
        for e in exc.errors()
    ]
    status = http_status(InvalidRequest())
    return JSONResponse(status_code=status, content={"detail": detail, "error": "invalid"})


async def loom_error(request: Request, exc: Exception) -> JSONResponse:
    """A Loom error kind, answered with the status `loom.core.errors.http_status` maps it to
    and its `code`, so that a client raises the kind the service raised."""
    assert isinstance(exc, LoomError)
    code = getattr(exc, "CODE", None) or exc.code
    status = http_status(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(
        status_code=status, content={"detail": str(exc), "error": code}, headers=headers
    )


def add_error_handlers(app: FastAPI) -> None:
    """The error mapping every FastAPI service uses: bad input and Loom's error kinds."""
    app.add_exception_handler(RequestValidationError, malformed_request)
    app.add_exception_handler(LoomError, loom_error)


def uvicorn_config(app: FastAPI, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        ws="none",
        timeout_graceful_shutdown=int(GRACEFUL_S),
    )


_BACKLOG = 2048  # uvicorn's own default


def bind(host: str, port: int) -> tuple[socket.socket, str, int]:
    """A TCP socket bound to `host:port` (0: a free port), and the host and port it got."""
    # NOTE: proto must say TCP: asyncio sets TCP_NODELAY on accepted connections only then,
    # and without it keep-alive responses wait ~40 ms for a delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # NOTE: listening before the address is announced: a client told the URL connects at once,
    # and a bound socket that does not listen yet refuses it (uvicorn listens only once it
    # has started up); until the server accepts, connections wait in the backlog
    sock.listen(_BACKLOG)
    bound_host, bound_port = sock.getsockname()[:2]
    return sock, bound_host, bound_port


def run_app(
    app: FastAPI,
    host: str,
    port: int,
    *,
    log_level: str = "info",
    on_bound: Callable[[str], None] | None = None,
    server: Callable[[uvicorn.Config], uvicorn.Server] = uvicorn.Server,
) -> None:
    """Serve `app` until interrupted (SIGINT/SIGTERM). `on_bound(url)` is told the address
    once the socket is bound (`port` 0 picks one); `server` builds the uvicorn server."""
    sock, host, port = bind(host, port)
    if on_bound is not None:
        on_bound(f"http://{host}:{port}")
    with sock:
        server(uvicorn_config(app, host, port, log_level)).run(sockets=[sock])


class DriverServer(uvicorn.Server):
    """uvicorn, but on shutdown the app's driver (`app.state.driver`) closes first, so that
    queued work is cancelled and open long-polls answer before uvicorn waits for open
    requests (it would otherwise wait out their `wait_s`)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        driver = getattr(self._app.state, "driver", None)
        if driver is not None:
            await driver.close()
        await super().shutdown(sockets)


class BackgroundService(Started):
    """A service in a daemon thread on a socket bound first (`port` 0: a free one); a context
    manager. One helper whatever the web framework: a subclass says how it serves
    (`_serve`, in the thread), when it has started and how it is asked to stop."""

    def __init__(self, host: str, port: int, *, name: str) -> None:
        self.name = name
        self._sock, self.host, self.port = bind(host, port)
        self.url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._error: BaseException | None = None

    def _serve(self) -> None:
        """Serve on `self._sock` until `_request_stop`."""
        raise NotImplementedError

    def _started(self) -> bool:
        raise NotImplementedError

    def _request_stop(self) -> None:
        raise NotImplementedError

    def _main(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # surfaced by start()/stop()
            self._error = exc

    def start(self, timeout_s: float = 30.0) -> Self:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._started():
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {self.name} did not start: {self._error!r}")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive():
            self._request_stop()
            self._thread.join(timeout_s)
        self._sock.close()
        assert not self._thread.is_alive(), f"the {self.name} did not stop"


class BackgroundApp(BackgroundService):
    """A FastAPI service under uvicorn in the background; `app.state.driver` stays readable
    after `stop`."""

    def __init__(
        self, app: FastAPI, host: str, port: int, *, name: str, log_level: str = "warning"
    ) -> None:
        super().__init__(host, port, name=name)
        self.app = app
        config = uvicorn_config(self.app, self.host, self.port, log_level)
        self._server = DriverServer(config, self.app)

    def _serve(self) -> None:
        self._server.run(sockets=[self._sock])

    def _started(self) -> bool:
        return bool(self._server.started)

    def _request_stop(self) -> None:
        self._server.should_exit = True
