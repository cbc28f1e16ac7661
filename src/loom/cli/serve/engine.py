"""`loom serve engine`: vLLM (the installed build: the `cpu-engine` extra's on machines without a
GPU, the user's own on GPUs) over a tiny random-weight model or a model directory, or with
`--emulate` an engine that behaves like a GPU (`emulated.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loom.cli.layer import Flag, Layering, Note, default_of
from loom.cli.options import ACCESS, AllowOpenOption, ConfigOption, TokenOption, console
from loom.cli.serve import emulated

if TYPE_CHECKING:
    from loom.runtime.engine import EngineConfig

__all__ = ["NOTES", "SETTINGS", "serve_engine"]


def _devices() -> list[str]:
    from loom.runtime.engine import EngineDevice

    return [d.value for d in EngineDevice]


def _model() -> type[EngineConfig]:
    from loom.runtime.engine import EngineConfig

    return EngineConfig


SETTINGS = Layering(
    "engine",
    _model,
    {
        # NOTE: --host and --port show their defaults themselves: an emulated engine takes them
        "host": Flag(shown=None),
        "port": Flag(shown=None),
        "max_running": Flag(shown=None),  # see `_max_running`
        "state_dir": Flag(),
        "priority": Flag(),
        "gpu_memory_utilization": Flag("memory", shown=None),
        "device": Flag(choices=_devices),
        "tensor_parallel_size": Flag("tp"),
        "devices": Flag(shown=None),
        "cpus": Flag(),
        "model": Flag(),
        "weight_sync": Flag(shown=None),
        "kv_store": Flag(shown=None),
        "token": ACCESS["token"],
        "allow_open": ACCESS["allow_open"],
    },
)


def _max_running() -> str:
    vllm = default_of(SETTINGS.model(), "max_running")
    emulated_ = default_of(emulated.SETTINGS.model(), "max_running")
    return f"default: {vllm}; with --emulate: {emulated_}"


NOTES: dict[str, Note] = {**SETTINGS.notes(), **emulated.NOTES, "max_running": _max_running}


def serve_engine(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", help="port to bind; 0 picks a free one")] = 0,
    host: Annotated[str, typer.Option("--host", help="address to bind")] = "127.0.0.1",
    max_running: Annotated[
        int | None, typer.Option("--max-running", help="most requests decoding at once")
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir", help="cache the model under DIR/engine-model"),
    ] = None,
    emulate: emulated.EmulateOption = None,
    time_scale: emulated.TimeScaleOption = None,
    scheduling_policy: emulated.SchedulingPolicyOption = None,
    stream_interval_ms: emulated.StreamIntervalOption = None,
    node: emulated.NodeOption = None,
    coserve: emulated.CoserveOption = None,
    role: emulated.RoleOption = None,
    priority: Annotated[
        bool | None,
        typer.Option(
            "--priority/--no-priority",
            help="schedule by the requests' `priority` field (vLLM --scheduling-policy "
            "priority; the router passes its scheduler's key there)",
            show_default=False,
        ),
    ] = None,
    memory: Annotated[
        float | None,
        typer.Option(
            "--gpu-memory-utilization",
            help="share of memory vLLM reserves for weights and KV: of host memory on the CPU "
            "build (default 0.1), of each GPU's on GPUs (default: vLLM's)",
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            "--device", help="cpu (vLLM's CPU build), gpu (any other), auto: as vLLM is built"
        ),
    ] = None,
    tp: Annotated[
        int | None,
        typer.Option("--tensor-parallel-size", help="GPUs the model is sharded over"),
    ] = None,
    devices: Annotated[
        str | None,
        typer.Option("--devices", help="GPUs it may use, e.g. 0,1 (CUDA_VISIBLE_DEVICES)"),
    ] = None,
    cpus: Annotated[
        str | None,
        typer.Option(
            "--cpus",
            help="cores of its compute threads, e.g. 1 or 0-1 (VLLM_CPU_OMP_THREADS_BIND); "
            "give engines on one machine different cores: 'auto' puts each on the first",
        ),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option("--model", help="serve this Hugging Face model directory instead"),
    ] = None,
    weight_sync: Annotated[
        bool,
        typer.Option(
            "--weight-sync", help="load new weights from the relay without a restart (sync_weights)"
        ),
    ] = False,
    kv_store: Annotated[
        Path | None,
        typer.Option(
            "--kv-store",
            help="move trajectories' KV through this folder, shared with the engines it moves "
            "to (Loom's KV connector; a tmpfs on one host)",
        ),
    ] = None,
    config: ConfigOption = None,
    token: TokenOption = None,
    allow_open: AllowOpenOption = False,
) -> None:
    """Serve a model with the installed vLLM: a tiny random-weight one (built once; nothing
    downloaded) or --model DIR, on the CPU (the cpu-engine extra) or on GPUs (your own vLLM);
    or with --emulate an engine that behaves like a GPU."""
    if emulate is not None:
        emulated.serve_emulated(ctx, host, port, token=token, config=config, allow_open=allow_open)
        return
    import signal

    from loom.core.extras import Extra, require
    from loom.runtime.engine import EngineProcess

    cfg = SETTINGS.build(ctx, config)
    require("loom serve engine", Extra.CPU_ENGINE)
    where = "on the CPU (about a minute)" if cfg.resolved_device == "cpu" else "on GPUs"
    console.log(f"[bold]loom engine[/bold]: starting vLLM {where}")
    engine = EngineProcess.start(cfg)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the engine too
    with engine:
        console.log(
            f"[bold]loom engine[/bold] on [link]{engine.url}[/link] — model"
            f" {engine.model_name}, max running {cfg.max_running}, log {engine.log_path}"
        )
        console.print(engine.url, highlight=False)
        try:
            code = engine.wait()
        except KeyboardInterrupt:
            code = 0
    if code:
        raise typer.Exit(code)
