"""Running the action server under uvicorn: in the foreground (`loom serve actions`) or in a
background thread on a socket already bound (tests, benchmarks, embedding)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

import uvicorn
from fastapi import FastAPI

from loom.runtime.actions.app import create_app
from loom.runtime.actions.config import ActionServerConfig
from loom.runtime.service import GRACEFUL_S, bind, run_app, uvicorn_config

__all__ = ["GRACEFUL_S", "BackgroundServer", "serve", "uvicorn_config"]

_bind = bind  # moved to loom.runtime.service


class _Server(uvicorn.Server):
    """uvicorn, but on shutdown the driver stops first: queued actions are cancelled, running
    ones killed, and every open long-poll answers with its action's terminal record before
    uvicorn waits for open requests (it would otherwise wait out their `wait_s`)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        driver = getattr(self._app.state, "driver", None)
        if driver is not None:
            await driver.close()
        await super().shutdown(sockets)


def serve(
    config: ActionServerConfig,
    log_level: str = "info",
    on_bound: Callable[[str], None] | None = None,
) -> None:
    """Serve until interrupted (SIGINT/SIGTERM); every action ends before it returns.
    `on_bound(url)` is told the address once the socket is bound (`port` 0 picks one)."""
    app = create_app(config)
    run_app(
        app,
        config.host,
        config.port,
        log_level=log_level,
        on_bound=on_bound,
        server=lambda cfg: _Server(cfg, app),
    )


class BackgroundServer:
    """The server in a daemon thread on a free port of `config.host`; a context manager.
    `app.state.driver` stays readable after `stop` (every action then is terminal)."""

    def __init__(
        self, config: ActionServerConfig, *, trust_env: bool = True, log_level: str = "warning"
    ) -> None:
        self.app = create_app(config, trust_env=trust_env)
        self._sock, host, port = bind(config.host, config.port)
        self.url = f"http://{host}:{port}"
        self._server = _Server(uvicorn_config(self.app, host, port, log_level), self.app)
        self._thread = threading.Thread(target=self._run, name="action-server", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # surfaced by start()/stop()
            self._error = exc

    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the action server did not start: {self._error!r}")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._sock.close()
        assert not self._thread.is_alive(), "the action server did not stop"

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
