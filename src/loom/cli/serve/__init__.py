"""`loom serve`: Loom's runtime services, a module each; every one takes the same listening and
access options (`loom.cli.options`) and lays its flags over its settings file the same way
(`loom.cli.layer`)."""

from __future__ import annotations

import typer

from loom.cli.command import add_command
from loom.cli.serve import actions, cluster, engine, relay, rollout

__all__ = ["app"]

app = typer.Typer(help="Run Loom's runtime services.", no_args_is_help=True)

add_command(app, "actions", actions.serve_actions, actions.SETTINGS.notes())
add_command(app, "relay", relay.serve_relay, relay.SETTINGS.notes())
add_command(app, "cluster", cluster.serve_cluster, cluster.SETTINGS.notes())
add_command(app, "rollout", rollout.serve_rollout, rollout.NOTES)
add_command(app, "engine", engine.serve_engine, engine.NOTES)
