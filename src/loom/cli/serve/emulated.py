"""`loom serve engine --emulate MODEL@GPU[:tpN]`: the simulator's worker on a scaled wall
clock, in vLLM's dialect; no model, no GPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loom.cli.layer import Flag, Layering, Note
from loom.cli.options import console

if TYPE_CHECKING:
    from loom.runtime.emulate.config import EmulatedEngineConfig, EmulationSpec

__all__ = [
    "NOTES",
    "SETTINGS",
    "CoserveOption",
    "EmulateOption",
    "NodeOption",
    "RoleOption",
    "SchedulingPolicyOption",
    "StreamIntervalOption",
    "TimeScaleOption",
    "serve_emulated",
]

EmulateOption = Annotated[
    str | None,
    typer.Option(
        "--emulate",
        help="MODEL@GPU[:tpN] (e.g. qwen3-14b@h100:tp2): instead of vLLM, an engine that "
        "behaves like that GPU (the simulator's worker on a scaled wall clock), in vLLM's "
        "dialect; no model, no GPU",
    ),
]
TimeScaleOption = Annotated[
    float | None,
    typer.Option(
        "--time-scale",
        help="with --emulate: wall seconds per GPU second (0.1: ten times faster)",
    ),
]
SchedulingPolicyOption = Annotated[
    str | None,
    typer.Option("--scheduling-policy", help="with --emulate: the order it runs requests in"),
]
NodeOption = Annotated[
    int | None,
    typer.Option(
        "--node",
        help="with --emulate: the node its GPUs sit on (KV moves to engines on the same node "
        "go over NVLink, others over the network)",
    ),
]
CoserveOption = Annotated[
    str | None,
    typer.Option(
        "--coserve",
        metavar="SERVING_MODEL",
        help="with --emulate: a lent serving GPU (ROSE): it serves this model's requests "
        "(a prefiller's or a decoder's, --role) and admits rollout turns beside them under "
        "the dual-SLO rule",
    ),
]
RoleOption = Annotated[
    str | None,
    typer.Option(
        "--role", help="with --coserve: the serving role, prefill or decode (default decode)"
    ),
]
StreamIntervalOption = Annotated[
    float | None,
    typer.Option(
        "--stream-interval-ms",
        help="with --emulate: wall milliseconds between a stream's chunks",
    ),
]


def _model() -> type[EmulatedEngineConfig]:
    from loom.runtime.emulate.config import EmulatedEngineConfig

    return EmulatedEngineConfig


def _spec(text: str) -> EmulationSpec:
    from loom.runtime.emulate.config import EmulationSpec

    return EmulationSpec.parse(text)


def _spec_note() -> str:
    """What MODEL and GPU may be."""
    from loom.perf.specs import list_gpus, list_models

    gpus = ", ".join(map(str, list_gpus()))
    return f"MODEL one of: {', '.join(list_models())}; GPU one of: {gpus}"


def _coserve(model: str, role: str | None) -> object:
    from loom.runtime.emulate.process import coserve

    return coserve(model, role or "decode")


def _policies() -> list[str]:
    from loom.rollout.engine_queue import EngineSchedulingPolicy

    return [p.value for p in EngineSchedulingPolicy]


SETTINGS = Layering(
    "emulated engine",
    _model,
    {
        "spec": Flag("emulate", convert=_spec, shown=None),
        "time_scale": Flag(),
        "scheduling_policy": Flag(choices=_policies),
        "max_running": Flag(shown=None),
        "node": Flag(shown=None),
        "coserve": Flag(convert=_coserve, uses=("role",), shown=None),
        "stream_interval_s": Flag(
            "stream_interval_ms", convert=lambda ms: ms / 1000, shown=lambda s: f"{s * 1000:g}"
        ),
    },
)
NOTES: dict[str, Note] = {**SETTINGS.notes(), "emulate": _spec_note}


def serve_emulated(
    ctx: typer.Context,
    host: str,
    port: int,
    *,
    token: str | None,
    config: Path | None,
    allow_open: bool,
) -> None:
    """Serve the emulated engine of `--emulate` until SIGTERM or ^C."""
    from loom.runtime.access import is_loopback
    from loom.runtime.emulate.server import serve

    if config is not None:
        raise typer.BadParameter("--config is not supported with --emulate")
    if token is None and not is_loopback(host) and not allow_open:
        raise typer.BadParameter(
            f"binding {host} (beyond loopback) without a token lets whoever can reach it use "
            "the engine: give a token (--token or LOOM_TOKEN), or --allow-open"
        )
    if ctx.params.get("role") is not None and ctx.params.get("coserve") is None:
        raise typer.BadParameter("--role is a lent GPU's serving role: it needs --coserve")
    cfg = dataclasses.replace(SETTINGS.build(ctx), token=token)

    def announce(url: str) -> None:
        console.log(
            f"[bold]loom engine[/bold] on [link]{url}[/link] — emulated {cfg.spec}, time scale "
            f"{cfg.time_scale:g}, max running {cfg.max_running}, {cfg.scheduling_policy} "
            "scheduling"
            + (
                f", lent: serves {cfg.coserve.serving_model} as a {cfg.coserve.role.value}r"
                if cfg.coserve is not None
                else ""
            )
        )
        console.print(url, highlight=False)

    serve(cfg, host, port, announce)
