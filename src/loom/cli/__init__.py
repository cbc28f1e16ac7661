"""`loom` command line: reproduce a paper's evaluation on the simulators, serve Loom's runtime
services, run RL jobs through them and plan their resources. A module per command group; heavy
modules are imported inside the commands, so that reading a command line stays fast."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from loom.cli import plan, reproduce, run, serve
from loom.cli.command import add_command

__all__ = ["app"]

app = typer.Typer(
    help="Loom: resource orchestration for RL post-training of LLMs.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False,
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING)


add_command(app, "reproduce", reproduce.reproduce, reproduce.NOTES)
app.add_typer(serve.app, name="serve")
app.add_typer(run.app, name="run")
app.add_typer(plan.app, name="plan")
