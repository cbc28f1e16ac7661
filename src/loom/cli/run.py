"""`loom run`: RL jobs through Loom's three levels."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from loom.cli.command import add_command
from loom.cli.options import console

__all__ = ["app"]

app = typer.Typer(help="Run RL jobs through Loom's three levels.", no_args_is_help=True)


def run_grpo(
    config: Annotated[
        Path | None, typer.Argument(help="TOML settings (default: the two-job example)")
    ] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="GRPO steps per job")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="records, summary, plots")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="seed of the whole run")] = None,
    baseline: Annotated[
        bool,
        typer.Option(
            "--baseline", help="without Loom's policies: least-load router, one job after another"
        ),
    ] = False,
    compare: Annotated[
        bool, typer.Option("--compare", help="run Loom's way, then the baseline; both reported")
    ] = False,
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json", help="write every step's record and each run's summary here, as one document"
        ),
    ] = None,
) -> None:
    """GRPO on a task with a verifiable reward, through the cluster service (training), the
    rollout router into vLLM engines whose weights follow training, and the action server's
    sandbox (tools, rewards)."""
    from loom.core.extras import Extra, require

    # training workers need torch; the engines vLLM, the tokenizer transformers
    require("loom run grpo", Extra.TORCH, Extra.CPU_ENGINE)
    from loom.rl.grpo.cli import main as grpo_main

    grpo_main(
        config, steps=steps, out=out, seed=seed, baseline=baseline, compare=compare,
        console=console, json_path=json_path,
    )  # fmt: skip


add_command(app, "grpo", run_grpo)
