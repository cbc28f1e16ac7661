"""`loom serve relay`: ROSE's relay store of model weights."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from loom.cli.layer import Flag, Layering
from loom.cli.options import (
    ACCESS,
    LISTEN,
    AllowOpenOption,
    ClosedHealthOption,
    ConfigOption,
    HostOption,
    PortOption,
    TokenOption,
)

if TYPE_CHECKING:
    from loom.runtime.relay.config import RelayConfig

__all__ = ["SETTINGS", "serve_relay"]

_UNITS = (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))


def _model() -> type[RelayConfig]:
    from loom.runtime.relay.config import RelayConfig

    return RelayConfig


def _size(text: str) -> int:
    from loom.runtime.relay.config import parse_size

    return parse_size(text)


def _shown_size(size: int) -> str:
    """`4G` for 4 GiB: the largest unit that divides it."""
    return next((f"{size // f}{u}" for u, f in _UNITS if size % f == 0), str(size))


SETTINGS = Layering(
    "relay",
    _model,
    {
        **LISTEN,
        "max_bytes": Flag(convert=_size, shown=_shown_size),
        "max_object_bytes": Flag(convert=_size, shown=_shown_size),
        "member_ttl_s": Flag(),
        **ACCESS,
    },
)


def serve_relay(
    ctx: typer.Context,
    host: HostOption = None,
    port: PortOption = None,
    max_bytes: Annotated[
        str | None,
        typer.Option("--max-bytes", help="memory cap of the objects stored, e.g. 8G"),
    ] = None,
    max_object_bytes: Annotated[
        str | None,
        typer.Option("--max-object-bytes", help="largest object (request body)"),
    ] = None,
    member_ttl_s: Annotated[
        float | None,
        typer.Option(
            "--member-ttl-s", help="a member silent this long is gone (default: until it leaves)"
        ),
    ] = None,
    token: TokenOption = None,
    allow_open: AllowOpenOption = False,
    closed_health: ClosedHealthOption = False,
    config: ConfigOption = None,
) -> None:
    """Relay model weights from training ranks to serving ranks over HTTP (ROSE's relay
    store): versioned objects pushed in buckets, pulled in batches, kept while a member needs
    them."""
    from loom.runtime.access import warn_if_open
    from loom.runtime.relay.server import serve

    settings = SETTINGS.build(ctx, config)
    warn_if_open(settings, "relay")

    def announce(url: str) -> None:  # once bound: with --port 0 it names the port it got
        typer.echo(
            f"loom relay on {url} — cap {settings.max_bytes} bytes, objects up to "
            f"{settings.max_object_bytes} bytes" + (", token required" if settings.token else "")
        )

    serve(settings, on_bound=announce)
