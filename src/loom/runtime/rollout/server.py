"""Running the rollout router: in the foreground (`loom serve rollout`) or in a background
thread on a socket already bound (tests, benchmarks, embedding in a trainer's process)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

from loom.core.errors import ConfigError, Conflict
from loom.runtime.rollout.app import DRIVER, create_app
from loom.runtime.rollout.config import RolloutServerConfig
from loom.runtime.rollout.driver import RolloutDriver, check_config
from loom.runtime.rollout.engines import EngineError
from loom.runtime.service import BackgroundService, bind

__all__ = ["BackgroundRouter", "new_loop", "serve"]


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it is installed (it halves the router's per-request CPU), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


async def _run(
    app: web.Application, sock: socket.socket, ready: Callable[[], None], stop: asyncio.Event
) -> None:
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        ready()
        await stop.wait()
    finally:
        await runner.cleanup()


def serve(config: RolloutServerConfig, announce: Callable[[str], None] = print) -> None:
    """Serve until interrupted (SIGINT/SIGTERM); in-flight turns end with an error."""
    import signal

    try:
        check_config(config)
        app = create_app(config)
    except ConfigError as exc:
        raise SystemExit(f"loom serve rollout: {exc}") from None
    sock, host, port = bind(config.host, config.port)
    loop = new_loop()
    asyncio.set_event_loop(loop)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def ready() -> None:
        engines = ", ".join(f"{e.id}={e.config.url}" for e in app[DRIVER].engines.values())
        announce(
            f"Loom rollout router on http://{host}:{port} "
            f"({config.placement.value} + {config.scheduler.value}; engines: {engines or 'none'})"
        )

    try:
        loop.run_until_complete(_run(app, sock, ready, stop))
    except (EngineError, Conflict) as exc:
        raise SystemExit(f"loom serve rollout: cannot start: {exc}") from None
    finally:
        loop.close()
        sock.close()


class BackgroundRouter(BackgroundService):
    """The router in a daemon thread on a free port of `config.host` (aiohttp on a loop of its
    own); `call(fn)` runs a function on the router's loop (to read the driver)."""

    def __init__(self, config: RolloutServerConfig, driver: RolloutDriver | None = None) -> None:
        check_config(config)
        super().__init__(config.host, config.port, name="rollout router")
        self.config = config
        self._loop = new_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.app = create_app(config, driver)

    @property
    def driver(self) -> RolloutDriver:
        return self.app[DRIVER]

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._stop = asyncio.Event()
        try:
            self._loop.run_until_complete(_run(self.app, self._sock, self._ready.set, self._stop))
        finally:
            self._loop.close()

    def _started(self) -> bool:
        return self._ready.is_set() and self._error is None

    def _request_stop(self) -> None:
        if self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop may have closed already
                self._loop.call_soon_threadsafe(self._stop.set)

    def call(self, fn: Callable[[RolloutDriver], Any], timeout_s: float = 60.0) -> Any:
        """Run `fn(driver)` on the router's loop; awaits it if it returns a coroutine."""

        async def run() -> Any:
            out = fn(self.driver)
            if asyncio.iscoroutine(out):
                out = await out
            return out

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout_s)
