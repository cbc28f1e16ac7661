"""`loom serve actions`: Tangram's action server."""

from __future__ import annotations

from pathlib import Path
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
    console,
)

if TYPE_CHECKING:
    from loom.runtime.actions import ActionServerConfig

__all__ = ["SETTINGS", "serve_actions"]


def _model() -> type[ActionServerConfig]:
    from loom.runtime.actions import ActionServerConfig

    return ActionServerConfig


def _policies() -> list[str]:
    from loom.runtime.actions.config import SERVER_POLICIES

    return [p.value for p in SERVER_POLICIES]


def _sandboxes() -> list[str]:
    from loom.runtime.actions.config import SandboxKind

    return [k.value for k in SandboxKind]


def _cores(text: str) -> tuple[int, ...]:
    from loom.runtime.actions.host import parse_cpulist

    return parse_cpulist(text)


SETTINGS = Layering(
    "action server",
    _model,
    {
        **LISTEN,
        "workdir": Flag(),
        "cores": Flag(convert=_cores),
        "policy": Flag(choices=_policies),
        "sandbox": Flag(choices=_sandboxes),
        "network": Flag("no_network", convert=lambda no: not no, shown=None),
        "linger_s": Flag(),
        "retain_s": Flag(),
        "retain_max": Flag(),
        "trajectory_idle_s": Flag(),
        **ACCESS,
    },
)


def serve_actions(
    ctx: typer.Context,
    config: ConfigOption = None,
    host: HostOption = None,
    port: PortOption = None,
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="trajectory workspaces (default: a temporary directory)"),
    ] = None,
    cores: Annotated[
        str | None,
        typer.Option("--cores", help='cores to schedule, e.g. "0-7,16" (default: all allowed)'),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            help="action policy (the paper's other baselines run in the simulator only)",
        ),
    ] = None,
    sandbox: Annotated[
        str | None,
        typer.Option("--sandbox", help="how CPU actions are isolated (bwrap: bubblewrap)"),
    ] = None,
    no_network: Annotated[
        bool, typer.Option("--no-network", help="refuse actions that ask for the network")
    ] = False,
    linger_s: Annotated[
        float | None,
        typer.Option("--linger-s", help="seconds an action's leftover processes may run on"),
    ] = None,
    retain_s: Annotated[
        float | None, typer.Option("--retain-s", help="seconds a finished action is kept")
    ] = None,
    retain_max: Annotated[
        int | None, typer.Option("--retain-max", help="finished actions kept at most")
    ] = None,
    trajectory_idle_s: Annotated[
        float | None,
        typer.Option(
            "--trajectory-idle-s", help="end a trajectory (free its memory) after this idle time"
        ),
    ] = None,
    token: TokenOption = None,
    allow_open: AllowOpenOption = False,
    closed_health: ClosedHealthOption = False,
) -> None:
    """Serve tool and reward actions over HTTP, scheduled by an action policy."""
    from loom.core.extras import Extra, require
    from loom.runtime.access import warn_if_open
    from loom.runtime.actions import serve
    from loom.runtime.actions.driver import policy_factory
    from loom.runtime.actions.host import local_cpu_node
    from loom.runtime.actions.sandbox import probe_bubblewrap

    settings = SETTINGS.build(ctx, config)
    if settings.services:  # GPU services are torch modules
        require("loom serve actions (with GPU services)", Extra.TORCH)
    node = local_cpu_node(settings.cores, settings.memory_gb)
    policy_factory(settings.policy)
    if settings.sandbox.value == "bwrap":
        # refuse to start, saying how to fix it, rather than fail later
        probe_bubblewrap(binds=settings.sandbox_ro_binds)
    cpus = ",".join(map(str, sorted(c for dom in node.numa for c in dom)))
    services = ", ".join(s.name for s in settings.services) or "none"

    def announce(url: str) -> None:  # once bound: with --port 0 it names the port it got
        console.log(
            f"[bold]loom action server[/bold] on [link]{url}[/link]"
            f" — policy {settings.policy.value}, cores {cpus} (NUMA domains: {len(node.numa)}),"
            f" APIs {len(settings.api)}, services {services}, sandbox {settings.sandbox.value};"
            " API docs at /docs"
        )

    warn_if_open(settings, "action server")
    serve(settings, on_bound=announce)
