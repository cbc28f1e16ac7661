"""`loom serve rollout`: the rollout router, here or on Ray."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from loom.cli.layer import Flag, Layering, Note
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
from loom.cli.serve import rollout_ray

if TYPE_CHECKING:
    from loom.runtime.rollout import RolloutServerConfig

__all__ = ["NOTES", "SETTINGS", "serve_rollout"]


def _model() -> type[RolloutServerConfig]:
    from loom.runtime.rollout import RolloutServerConfig

    return RolloutServerConfig


def _placements() -> list[str]:
    from loom.rollout.policy import ROUTERS, PlacementKind

    return [kind.value for kind in PlacementKind if kind in ROUTERS]


def _schedulers() -> list[str]:
    from loom.rollout.policy import SCHEDULERS, SchedulerKind

    return [kind.value for kind in SchedulerKind if kind in SCHEDULERS]


def _engine_syntax() -> str:
    from loom.runtime.rollout.config import engine_spec_syntax

    return engine_spec_syntax()


def _engines(
    specs: list[str], tp: int | None, max_running: int | None
) -> tuple[dict[str, Any], ...]:
    from loom.runtime.rollout.config import parse_engine

    defaults = {"tp": tp, "max_running": max_running}
    return tuple(parse_engine(spec, defaults) for spec in specs)


SETTINGS = Layering(
    "rollout router",
    _model,
    {
        "engines": Flag("engine", convert=_engines, uses=("tp", "max_running"), shown=None),
        "placement": Flag(choices=_placements),
        "scheduler": Flag(choices=_schedulers),
        **LISTEN,
        "state_dir": Flag(),
        "profiles": Flag("profile", convert=tuple, shown=None),
        "tokenizer": Flag(),
        **ACCESS,
    },
)
NOTES: dict[str, Note] = {
    **rollout_ray.SETTINGS.notes(),
    **SETTINGS.notes(),
    "engine": _engine_syntax,
}


def serve_rollout(
    ctx: typer.Context,
    engine: Annotated[
        list[str] | None,
        typer.Option("--engine", help="an inference engine; repeat for more"),
    ] = None,
    placement: Annotated[
        str | None,
        typer.Option(
            "--placement",
            help="where turns run: Heddle's placement or a baseline's (cache_aware is verl's, "
            "least_load slime's, hybrid sglang-router's)",
        ),
    ] = None,
    scheduler: Annotated[
        str | None, typer.Option("--scheduler", help="the order turns run in (pps: Heddle's)")
    ] = None,
    config: ConfigOption = None,
    host: HostOption = None,
    port: PortOption = None,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir", help="keeps the trajectory history the predictor learns from"),
    ] = None,
    max_running: Annotated[
        int | None,
        typer.Option(
            "--max-running",
            help="most turns in flight per engine (default: as many as each runs at once by "
            "what it reports)",
        ),
    ] = None,
    tp: Annotated[
        int | None, typer.Option("--tp", help="tensor-parallel degree of every engine")
    ] = None,
    profile: Annotated[
        list[Path] | None,
        typer.Option("--profile", help="engine profile CSV per TP degree for Heddle's placement"),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            help="tokenizer of text prompts (a path or Hugging Face name; default: the "
            "engines' model; 'engine': ask an engine's /tokenize)",
        ),
    ] = None,
    token: TokenOption = None,
    allow_open: AllowOpenOption = False,
    closed_health: ClosedHealthOption = False,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="on Ray: the router a named actor, engines started in a "
            "placement group (one bundle of --tp GPUs each)",
        ),
    ] = False,
    ray_engines: rollout_ray.EnginesOption = None,
    engine_kind: rollout_ray.EngineKindOption = None,
    engine_gpus: rollout_ray.EngineGpusOption = None,
    ray_address: rollout_ray.AddressOption = None,
    engine_model: rollout_ray.EngineModelOption = None,
    engine_args: rollout_ray.EngineArgsOption = None,
) -> None:
    """Route the turns of rollout trajectories to inference engines, scheduled and placed by
    Heddle's policies or a baseline's."""
    from loom.runtime.access import warn_if_open
    from loom.runtime.rollout import serve

    rollout_ray.check_flags(ray, ray_engines, engine_kind, engine_gpus, ray_address,
                            engine_model, engine_args)  # fmt: skip
    settings = SETTINGS.build(ctx, config)
    warn_if_open(settings, "rollout router")
    if ray:
        rollout_ray.serve_on_ray(ctx, settings, engine_model, engine_args)
        return
    serve(settings, announce=lambda line: console.log(line))
