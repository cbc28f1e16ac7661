"""`loom plan`: resources for Loom's runtime, planned from a history of trajectories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loom.cli.command import add_command
from loom.cli.layer import Flag, Layering, one_of
from loom.cli.options import console
from loom.core.errors import ConfigError
from loom.core.trajectory import WorkloadKind

if TYPE_CHECKING:
    from loom.runtime.rollout.plan import PlanSettings

__all__ = ["app"]

app = typer.Typer(help="Plan resources for Loom's runtime.", no_args_is_help=True)


def _models() -> list[str]:
    from loom.perf.specs import list_models

    return list_models()


def _gpus() -> list[str]:
    from loom.perf.specs import list_gpus

    return [str(gpu) for gpu in list_gpus()]


def _plan_settings() -> type[PlanSettings]:
    from loom.runtime.rollout.plan import PlanSettings

    return PlanSettings


def _degrees(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in text.split(",") if d.strip())
    except ValueError:
        raise ConfigError(f"not a list of integers: {text!r}") from None


PLAN = Layering(
    "rollout plan",
    _plan_settings,
    {
        "gpus": Flag(),
        "degrees": Flag(convert=_degrees, shown=lambda d: ",".join(map(str, d))),
        "profiles": Flag("profile", convert=tuple),
        "model": Flag(choices=_models),
        "gpu": Flag(choices=_gpus),
        "max_running": Flag(),
        "gpus_per_node": Flag(),
        "seed": Flag(),
        "batch": Flag(),
        "simulate": Flag(),
    },
)


def plan_rollout(
    ctx: typer.Context,
    gpus: Annotated[int, typer.Option("--gpus", help="GPU budget of the rollout")],
    history: Annotated[
        Path,
        typer.Option("--history", help="finished trajectories, JSON lines (loom.rollout.history)"),
    ],
    profile: Annotated[
        list[Path] | None,
        typer.Option("--profile", help="engine profile CSV, one per TP degree (repeatable)"),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="roofline cost model without --profile")
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU of that roofline")] = None,
    degrees: Annotated[str | None, typer.Option("--degrees", help="TP degrees to use")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="seed of the annealing")] = None,
    max_running: Annotated[
        int | None, typer.Option("--max-running", help="turns an engine runs at once")
    ] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", help="for device ids and engine hosts")
    ] = None,
    batch: Annotated[
        int | None,
        typer.Option(
            "--batch", help="plan for the history's latest N trajectories (one batch of them)"
        ),
    ] = None,
    simulate: Annotated[
        bool | None,
        typer.Option(
            "--simulate",
            help="serve the batch on the annealed and the uniform layouts in the simulator and "
            "keep the fastest (about 20 s a layout for 512 trajectories)",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON object")] = False,
) -> None:
    """Print Heddle's annealed model-parallel layout for a GPU budget, planned for a batch like
    the history (its k=0 predicted lengths), and the engines to start from it."""
    from loom.rollout.history import read_history
    from loom.runtime.rollout import plan as rollout_plan

    if profile and (model is not None or gpu is not None):
        raise typer.BadParameter("--model/--gpu choose the roofline cost; --profile replaces it")
    settings = PLAN.build(ctx)
    plan = rollout_plan.plan_rollout(read_history(history), settings)
    if as_json:
        typer.echo(json.dumps(plan.to_json(), indent=2))
        return
    console.print(rollout_plan.plan_table(plan))
    console.print("Start one engine per worker (vLLM shown; SGLang takes --tp):")
    for w in plan.workers:
        console.print(f"  {w.command(plan.single_node)}", markup=False, soft_wrap=True)
    console.print("and list them with their TP degrees in `loom serve rollout --config FILE`:")
    for engine in plan.engines():
        url, tp = engine["url"], engine["tp"]
        console.print(f'  [[engines]]\n  url = "{url}"\n  tp = {tp}', markup=False)


def plan_example_history(
    out: Annotated[Path, typer.Argument(help="JSON-lines file to write")],
    workload: Annotated[WorkloadKind, typer.Option("--workload")] = WorkloadKind.CODING,
    model: Annotated[str, typer.Option("--model", help="model the lengths are for")] = "qwen3-14b",
    prompts: Annotated[int, typer.Option("--prompts", min=1)] = 64,
    samples: Annotated[int, typer.Option("--samples", min=1, help="per prompt")] = 16,
    seed: Annotated[int, typer.Option("--seed", help="seed of the prompts")] = 1,
    epoch: Annotated[int, typer.Option("--epoch", help="which epoch's samples")] = 0,
) -> None:
    """Write a synthetic history from Loom's agentic workload generator."""
    from loom.rollout.history import write_history
    from loom.sim.workloads.agentic import AgenticWorkload

    try:
        wl = AgenticWorkload(
            kind=workload, model=model, num_prompts=prompts, samples=samples, prompt_seed=seed
        )
        count = write_history(out, wl.sample(epoch))
    except OSError as exc:
        raise ConfigError(str(exc)) from None
    console.print(f"wrote {count} trajectories ({workload.value}, {model}) to {out}")


add_command(app, "rollout", plan_rollout, PLAN.notes())
add_command(app, "example-history", plan_example_history, {"model": lambda: one_of(_models())})
