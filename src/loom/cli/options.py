"""The options every `loom serve` takes (where it listens, who may use it, its settings file),
the settings fields they set, and the console commands print to."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from loom.cli.layer import Flag

__all__ = [
    "ACCESS",
    "LISTEN",
    "AllowOpenOption",
    "ClosedHealthOption",
    "ConfigOption",
    "HostOption",
    "PortOption",
    "TokenOption",
    "console",
]

console = Console()

HostOption = Annotated[str | None, typer.Option("--host", help="address to bind")]
PortOption = Annotated[int | None, typer.Option("--port", help="port to bind; 0 picks a free one")]
# The bearer token of every service (`--token` or LOOM_TOKEN).
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="LOOM_TOKEN",
        help="bearer token every route but /healthz requires (needed beyond loopback)",
        show_default=False,
    ),
]
AllowOpenOption = Annotated[
    bool,
    typer.Option(
        "--allow-open",
        help="serve beyond loopback without a token (warns loudly; refused otherwise)",
    ),
]
ClosedHealthOption = Annotated[
    bool,
    typer.Option("--closed-health", help="health and metrics need the token too"),
]
ConfigOption = Annotated[Path | None, typer.Option("--config", help="TOML or JSON settings file")]

# the settings fields these options set, in every service's settings (`loom.runtime.access`)
LISTEN = {"host": Flag(), "port": Flag()}
ACCESS = {
    "token": Flag(shown=None),
    "allow_open": Flag(shown=None),
    "open_health": Flag("closed_health", convert=operator.not_, shown=None),
}
