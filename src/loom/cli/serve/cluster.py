"""`loom serve cluster`: PlexRL's Scheduler and Router."""

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
)
from loom.core.extras import Extra

if TYPE_CHECKING:
    from loom.runtime.cluster.app import ClusterConfig

__all__ = ["SETTINGS", "serve_cluster"]

# what the service needs to start worker groups, by its launcher: torch for worker processes
# here; Ray for actors on the cluster's nodes (which need torch themselves)
_NEEDS = {"process": Extra.TORCH, "ray": Extra.RAY}


def _model() -> type[ClusterConfig]:
    from loom.runtime.cluster.app import ClusterConfig

    return ClusterConfig


def _policies() -> list[str]:
    from loom.cluster.plexrl.hrrs import OP_POLICIES, OpPolicyKind

    return [kind.value for kind in OpPolicyKind if kind in OP_POLICIES]


SETTINGS = Layering(
    "cluster",
    _model,
    {
        **LISTEN,
        "groups": Flag(),
        "policy": Flag(choices=_policies),
        "state_dir": Flag(),
        "gpus_per_group": Flag(),
        **ACCESS,
    },
)


def serve_cluster(
    ctx: typer.Context,
    host: HostOption = None,
    port: PortOption = None,
    groups: Annotated[
        int | None, typer.Option("--groups", help="node groups (a deployment runs on one)")
    ] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="operation policy")] = None,
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="where offloaded state spills to disk")
    ] = None,
    gpus_per_group: Annotated[
        int | None, typer.Option("--gpus-per-group", help="GPUs of a node group")
    ] = None,
    config: ConfigOption = None,
    token: TokenOption = None,
    allow_open: AllowOpenOption = False,
    closed_health: ClosedHealthOption = False,
) -> None:
    """PlexRL's Scheduler and Router: RL jobs create deployments (worker-process groups on
    node groups) and send them operations; the service runs them one at a time per node
    group under its operation policy, switching state between jobs (needs the torch extra;
    with `launcher = "ray"`, the ray extra)."""
    from loom.core.extras import require
    from loom.runtime.access import warn_if_open
    from loom.runtime.cluster.app import serve

    settings = SETTINGS.build(ctx, config)
    require("loom serve cluster", _NEEDS[settings.launcher])
    warn_if_open(settings, "cluster service")

    def announce(url: str) -> None:
        typer.echo(
            f"loom cluster on {url} — {settings.groups} node group(s), policy {settings.policy}"
        )

    serve(settings, on_bound=announce)
