"""What Loom's FastAPI services share: running the app under uvicorn on a socket bound first
(so `--port 0` can say which port it got), in the foreground or in a background thread. The
token check, the body limit and the error bodies are the shared web layer's
(`loom.runtime.web`; re-exported here), the same for the aiohttp services.

The choice: two stacks over one shared layer, not one stack, because the router's server CPU
per request is lower on aiohttp (measured by `benchmarks/bench_web_stack.py`; the figures are
in `docs/services/rollout.md`, rendered from `docs/results/bench-web-stack.json`)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Self

import uvicorn
from fastapi import FastAPI

from loom.core.lifecycle import Started
from loom.runtime.access import is_loopback
from loom.runtime.web.asgi import (
    BearerToken,
    BodyLimit,
    add_error_handlers,
    loom_error,
    malformed_request,
)

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
