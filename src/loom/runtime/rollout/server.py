"""Running the rollout router: in the foreground (`loom serve rollout`) or in a background
thread on a socket already bound (tests, benchmarks, embedding in a trainer's process)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from aiohttp import web

from loom.core.errors import ConfigError, Conflict
from loom.runtime.rollout.app import DRIVER, create_app
from loom.runtime.rollout.config import RolloutServerConfig
from loom.runtime.rollout.driver import RolloutDriver, check_config
from loom.runtime.rollout.engines import EngineError

__all__ = ["BackgroundRouter", "bind", "new_loop", "serve"]


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it is installed (it halves the router's per-request CPU), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


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
    sock = bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
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


class BackgroundRouter:
    """The router in a daemon thread on a free port of `config.host`; a context manager.
    `call(coro_fn)` runs a coroutine function on the router's loop (to read the driver)."""

    def __init__(self, config: RolloutServerConfig, driver: RolloutDriver | None = None) -> None:
        check_config(config)
        self.config = config
        self._sock = bind(config.host, config.port)
        host, port = self._sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self._loop = new_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.app = create_app(config, driver)
        self._thread = threading.Thread(target=self._main, name="rollout-router", daemon=True)

    @property
    def driver(self) -> RolloutDriver:
        return self.app[DRIVER]

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._stop = asyncio.Event()
        try:
            self._loop.run_until_complete(_run(self.app, self._sock, self._ready.set, self._stop))
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    def start(self, timeout_s: float = 60.0) -> BackgroundRouter:
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._error is not None:
            self.stop()
            raise RuntimeError(f"the rollout router did not start: {self._error!r}")
        return self

    def call(self, fn: Callable[[RolloutDriver], Any], timeout_s: float = 60.0) -> Any:
        """Run `fn(driver)` on the router's loop; awaits it if it returns a coroutine."""

        async def run() -> Any:
            out = fn(self.driver)
            if asyncio.iscoroutine(out):
                out = await out
            return out

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self) -> BackgroundRouter:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
