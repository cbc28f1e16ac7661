"""Running the action server under uvicorn: in the foreground (`loom serve actions`) or in a
background thread on a socket already bound (tests, benchmarks, embedding)."""

from __future__ import annotations

from collections.abc import Callable

from loom.runtime.actions.app import create_app
from loom.runtime.actions.config import ActionServerConfig
from loom.runtime.service import (
    GRACEFUL_S,
    BackgroundApp,
    DriverServer,
    bind,
    run_app,
    uvicorn_config,
)

__all__ = ["GRACEFUL_S", "BackgroundServer", "serve", "uvicorn_config"]

_bind = bind  # moved to loom.runtime.service


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
        server=lambda cfg: DriverServer(cfg, app),
    )


class BackgroundServer(BackgroundApp):
    """The server in a daemon thread on a free port of `config.host`; a context manager.
    `app.state.driver` stays readable after `stop` (every action then is terminal)."""

    def __init__(
        self, config: ActionServerConfig, *, trust_env: bool = True, log_level: str = "warning"
    ) -> None:
        super().__init__(
            create_app(config, trust_env=trust_env),
            config.host,
            config.port,
            name="action server",
            log_level=log_level,
        )
