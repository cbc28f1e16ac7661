"""Running the relay under uvicorn in the foreground (`loom serve relay`)."""

from __future__ import annotations

from collections.abc import Callable

from loom.runtime.relay.app import create_app
from loom.runtime.relay.config import RelayConfig
from loom.runtime.service import run_app

__all__ = ["serve"]


def serve(
    config: RelayConfig, log_level: str = "warning", on_bound: Callable[[str], None] | None = None
) -> None:
    """Serve until interrupted (SIGINT/SIGTERM); what is stored is lost when it returns.
    `on_bound(url)` is told the address once the socket is bound (`port` 0 picks one)."""
    run_app(create_app(config), config.host, config.port, log_level=log_level, on_bound=on_bound)
