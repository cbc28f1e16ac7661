"""`loom serve rollout --ray`: the router as a named Ray actor, its engines in one placement
group; its flags set a `RayDeployConfig`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loom.cli.layer import Flag, Layering
from loom.cli.options import console

if TYPE_CHECKING:
    from loom.runtime.engine import EngineConfig
    from loom.runtime.rollout import RolloutServerConfig
    from loom.runtime.rollout.ray_deploy import RayDeployConfig

__all__ = [
    "SETTINGS",
    "AddressOption",
    "EngineArgsOption",
    "EngineGpusOption",
    "EngineKindOption",
    "EngineModelOption",
    "EnginesOption",
    "check_flags",
    "serve_on_ray",
]

EnginesOption = Annotated[
    int | None, typer.Option("--engines", help="with --ray: engines to start")
]
EngineKindOption = Annotated[
    str | None, typer.Option("--engine-kind", help="with --ray: the engines' kind")
]
EngineGpusOption = Annotated[
    int | None,
    typer.Option("--engine-gpus", help="with --ray: GPUs per engine (default --tp; 0: CPU)"),
]
AddressOption = Annotated[
    str | None,
    typer.Option("--ray-address", help="with --ray: cluster to join ('auto': a running one)"),
]
EngineModelOption = Annotated[
    Path | None,
    typer.Option(
        "--engine-model",
        help="with --ray: the model directory every vLLM engine serves, on every node "
        "(default: Loom's tiny random-weight model)",
    ),
]
EngineArgsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--engine-arg",
        help="with --ray: one more vLLM flag or value, repeatable, e.g. "
        "--engine-arg=--dtype --engine-arg=bfloat16 (later flags override Loom's)",
    ),
]


def _model() -> type[RayDeployConfig]:
    from loom.runtime.rollout.ray_deploy import RayDeployConfig

    return RayDeployConfig


def _launchers() -> list[str]:
    from loom.runtime.rollout.ray_deploy import EngineLauncher

    return [k.value for k in EngineLauncher]


SETTINGS = Layering(
    "Ray deployment",
    _model,
    {
        "engines": Flag("ray_engines"),
        # the router's flags that the deployment's engines take too
        "tp": Flag(shown=None),
        "max_running": Flag(shown=None),
        "host": Flag(shown=None),
        "launcher": Flag("engine_kind", choices=_launchers),
        "gpus": Flag("engine_gpus"),
        "address": Flag("ray_address"),
    },
)


def check_flags(ray: bool, *ray_flags: object) -> None:
    if not ray and any(flag is not None for flag in ray_flags):
        raise typer.BadParameter(
            "--engines, --engine-kind, --engine-gpus, --engine-model, --engine-arg and "
            "--ray-address go with --ray"
        )


def serve_on_ray(
    ctx: typer.Context,
    settings: RolloutServerConfig,
    engine_model: Path | None,
    engine_args: list[str] | None,
) -> None:
    """Deploy the router and its engines on Ray; return when it is shut down."""
    from loom.core.extras import Extra, require
    from loom.runtime.rollout.ray_deploy import serve_ray

    require("loom serve rollout --ray", Extra.RAY)
    config = SETTINGS.build(ctx, vllm=_vllm(engine_model, engine_args))
    serve_ray(settings, config, announce=lambda line: console.log(line))


def _vllm(model: Path | None, args: list[str] | None) -> EngineConfig | None:
    """The template of the deployment's vLLM engines, where a flag says more than the
    defaults."""
    if model is None and not args:
        return None
    from loom.runtime.engine import EngineConfig

    config = EngineConfig(extra_args=tuple(args or ()))
    if model is None:
        return config
    return replace(config, model=model.expanduser().resolve(), served_model_name=model.name)
