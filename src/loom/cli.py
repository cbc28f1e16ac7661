"""`loom` command line: reproduce a paper's evaluation on the simulators."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loom.core.errors import UnknownPolicyError
from loom.core.trajectory import WorkloadKind
from loom.experiments.registry import SYSTEMS
from loom.experiments.report import (
    Record,
    Task,
    print_tables,
    records_json,
    write_csvs,
    write_json,
)

if TYPE_CHECKING:
    from loom.runtime.rollout import RolloutServerConfig

app = typer.Typer(
    help="Loom: resource orchestration for RL post-training of LLMs.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False,
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING)


@app.command()
def reproduce(
    system: Annotated[str, typer.Argument(help=f"one of: {', '.join(SYSTEMS.names())}")],
    quick: Annotated[
        bool, typer.Option("--quick", help="smaller scale, same comparisons: minutes on 2 cores")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="seed of every random draw")] = 1,
    out: Annotated[Path, typer.Option("--out", help="directory for CSV and PNG files")] = Path(
        "results"
    ),
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json", help="write tidy records here; `-` prints them to stdout instead of tables"
        ),
    ] = None,
    only: Annotated[
        str | None,
        typer.Option("--only", help="comma-separated experiments to run, e.g. fig14,fig15"),
    ] = None,
) -> None:
    """Run a paper's experiments on identical seeded workloads; print tables, write CSV/PNG/JSON."""
    try:
        rep = SYSTEMS.get(system)
    except UnknownPolicyError as exc:
        raise typer.BadParameter(str(exc), param_hint="SYSTEM") from None
    total, tasks = rep.tasks(seed, quick)
    if only is not None:
        tasks, total = _select(tasks, only)
    to_stdout = json_path == Path("-")
    # NOTE: with `--json -` stdout carries the JSON document alone; progress goes to stderr
    out_console = Console(stderr=True) if to_stdout else console
    records: list[Record] = []
    columns = (
        TextColumn("{task.description:<40}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=out_console, transient=False) as progress:
        bar = progress.add_task(f"{system}", total=total)
        for label, thunk in tasks:
            progress.update(bar, description=label)
            records += [{"system": system, **r} for r in thunk()]
            progress.advance(bar)
    records += [{"system": system, **r} for r in rep.summary(records)]
    if not to_stdout:
        print_tables(records, console, title=system)
    out_dir = out / system
    write_csvs(records, out_dir)
    plots = rep.plot(records, out_dir)
    if to_stdout:
        typer.echo(records_json(system, seed, quick, records))
    elif json_path is not None:
        write_json(json_path, system, seed, quick, records)
    out_console.print(
        f"wrote {len(records)} records, CSV and {len(plots)} plots under {out_dir}"
        + (f", JSON at {json_path}" if json_path and not to_stdout else "")
    )


def _select(tasks: Iterable[Task], only: str) -> tuple[Iterator[Task], int]:
    """The tasks of the named experiments (a task's label starts with its experiment)."""
    wanted = {name.strip() for name in only.split(",") if name.strip()}
    listed = list(tasks)
    known = sorted({label.split()[0] for label, _ in listed})
    unknown = sorted(wanted - set(known))
    if unknown or not wanted:
        raise typer.BadParameter(
            f"unknown experiment(s) {unknown or [only]}; choose from {', '.join(known)}",
            param_hint="--only",
        )
    kept = [(label, thunk) for label, thunk in listed if label.split()[0] in wanted]
    return iter(kept), len(kept)


serve_app = typer.Typer(help="Run Loom's runtime services.", no_args_is_help=True)
# The bearer token of every service (`--token` or LOOM_TOKEN).
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="LOOM_TOKEN",
        help="bearer token every route but /healthz requires (needed beyond loopback)",
        show_default=False,
    ),
]
AllowOpenOption = Annotated[
    bool,
    typer.Option(
        "--allow-open",
        help="serve beyond loopback without a token (warns loudly; refused otherwise)",
    ),
]
ClosedHealthOption = Annotated[
    bool,
    typer.Option("--closed-health", help="health and metrics need the token too"),
]
ConfigOption = Annotated[Path | None, typer.Option("--config", help="TOML or JSON settings file")]
app.add_typer(serve_app, name="serve")


def _access(token: str | None, allow_open: bool, closed_health: bool) -> dict[str, Any]:
    """The access settings every `loom serve` takes, as overrides (None: unchanged)."""
    return {
        "token": token,
        "allow_open": True if allow_open else None,
        "open_health": False if closed_health else None,
    }


@serve_app.command("actions")
def serve_actions(
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML or JSON settings file")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="address to bind")] = None,
    port: Annotated[int | None, typer.Option("--port", help="port to bind")] = None,
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
        typer.Option("--policy", help="action policy (tangram, tangram_lookahead, dop4, dop16)"),
    ] = None,
    sandbox: Annotated[
        str | None,
        typer.Option(
            "--sandbox", help="isolate CPU actions: bwrap (bubblewrap, the default) or none"
        ),
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
    from loom.core.errors import ConfigError
    from loom.runtime.actions import ActionServerConfig, load_config, serve
    from loom.runtime.actions.driver import policy_factory
    from loom.runtime.actions.host import local_cpu_node, parse_cpulist
    from loom.runtime.actions.sandbox import probe_bubblewrap

    try:
        base = load_config(config) if config is not None else ActionServerConfig()
        settings = base.with_overrides(
            host=host,
            port=port,
            workdir=workdir,
            cores=parse_cpulist(cores) if cores is not None else None,
            policy=policy,
            sandbox=sandbox,
            network=False if no_network else None,
            linger_s=linger_s,
            retain_s=retain_s,
            retain_max=retain_max,
            trajectory_idle_s=trajectory_idle_s,
            **_access(token, allow_open, closed_health),
        )
        node = local_cpu_node(settings.cores, settings.memory_gb)
        policy_factory(settings.policy)
        if settings.sandbox.value == "bwrap":
            # refuse to start, saying how to fix it, rather than fail later
            probe_bubblewrap(binds=settings.sandbox_ro_binds)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    cpus = ",".join(map(str, sorted(c for dom in node.numa for c in dom)))
    services = ", ".join(s.name for s in settings.services) or "none"

    def announce(url: str) -> None:  # once bound: with --port 0 it names the port it got
        console.log(
            f"[bold]loom action server[/bold] on [link]{url}[/link]"
            f" — policy {settings.policy.value}, cores {cpus} (NUMA domains: {len(node.numa)}),"
            f" APIs {len(settings.api)}, services {services}, sandbox {settings.sandbox.value};"
            " API docs at /docs"
        )

    from loom.runtime.access import warn_if_open

    warn_if_open(settings, "action server")
    serve(settings, on_bound=announce)


@serve_app.command("relay")
def serve_relay(
    host: Annotated[
        str | None, typer.Option("--host", help="address to bind (default 127.0.0.1)")
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", help="port to bind; 0 picks a free one (default 8079)")
    ] = None,
    max_bytes: Annotated[
        str | None,
        typer.Option("--max-bytes", help="memory cap of the objects stored, e.g. 8G (default 4G)"),
    ] = None,
    max_object_bytes: Annotated[
        str | None,
        typer.Option("--max-object-bytes", help="largest object (request body), default 1G"),
    ] = None,
    member_ttl_s: Annotated[
        float | None,
        typer.Option(
            "--member-ttl-s", help="a member silent this long is gone (default: until it leaves)"
        ),
    ] = None,
    token: TokenOption = None,
    allow_open: AllowOpenOption = False,
    closed_health: ClosedHealthOption = False,
    config: ConfigOption = None,
) -> None:
    """Relay model weights from training ranks to serving ranks over HTTP (ROSE's relay
    store): versioned objects pushed in buckets, pulled in batches, kept while a member needs
    them."""
    from loom.core.errors import ConfigError
    from loom.core.settings import load_settings
    from loom.runtime.relay.config import RelayConfig, parse_size
    from loom.runtime.relay.server import serve

    try:
        base = load_settings(RelayConfig, config, "relay") if config else RelayConfig()
        settings = base.with_overrides(
            host=host,
            port=port,
            max_bytes=parse_size(max_bytes) if max_bytes is not None else None,
            max_object_bytes=parse_size(max_object_bytes) if max_object_bytes is not None else None,
            member_ttl_s=member_ttl_s,
            **_access(token, allow_open, closed_health),
        )
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    from loom.runtime.access import warn_if_open

    warn_if_open(settings, "relay")

    def announce(url: str) -> None:  # once bound: with --port 0 it names the port it got
        typer.echo(
            f"loom relay on {url} — cap {settings.max_bytes} bytes, objects up to "
            f"{settings.max_object_bytes} bytes" + (", token required" if settings.token else "")
        )

    serve(settings, on_bound=announce)


@serve_app.command("cluster")
def serve_cluster(
    host: Annotated[
        str | None, typer.Option("--host", help="address to bind (default 127.0.0.1)")
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", help="port to bind; 0 picks a free one (8900)")
    ] = None,
    groups: Annotated[
        int | None, typer.Option("--groups", help="node groups (a deployment runs on one)")
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            help="operation policy: hrrs (default), hrrs_alg1, hrrn, fcfs, round_robin",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="where offloaded state spills to disk")
    ] = None,
    gpus_per_group: Annotated[
        int | None, typer.Option("--gpus-per-group", help="GPUs of a node group (8)")
    ] = None,
    config: ConfigOption = None,
    token: TokenOption = None,
    allow_open: AllowOpenOption = False,
    closed_health: ClosedHealthOption = False,
) -> None:
    """PlexRL's Scheduler and Router: RL jobs create deployments (worker-process groups on
    node groups) and send them operations; the service runs them one at a time per node
    group under its operation policy, switching state between jobs (needs the torch extra)."""
    from loom.core.errors import ConfigError
    from loom.core.settings import load_settings, override
    from loom.runtime.cluster.app import ClusterConfig, serve

    try:
        base = load_settings(ClusterConfig, config, "cluster") if config else ClusterConfig()
        settings = override(
            base,
            "cluster",
            host=host,
            port=port,
            groups=groups,
            policy=policy,
            state_dir=state_dir,
            gpus_per_group=gpus_per_group,
            **_access(token, allow_open, closed_health),
        )
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    from loom.runtime.access import warn_if_open

    warn_if_open(settings, "cluster service")

    def announce(url: str) -> None:
        typer.echo(
            f"loom cluster on {url} — {settings.groups} node group(s), policy {settings.policy}"
        )

    serve(settings, on_bound=announce)


@serve_app.command("rollout")
def serve_rollout(
    engine: Annotated[
        list[str] | None,
        typer.Option(
            "--engine",
            help="an inference engine: URL[,tp=N][,max_running=N][,kind=vllm|sglang]"
            "[,priority=false][,id=NAME]; repeat for more",
        ),
    ] = None,
    placement: Annotated[
        str | None,
        typer.Option("--placement", help="heddle, cache_aware (verl), least_load (slime), hybrid"),
    ] = None,
    scheduler: Annotated[
        str | None, typer.Option("--scheduler", help="pps (Heddle), fcfs, rr, sjf")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML or JSON settings file")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="address to bind")] = None,
    port: Annotated[int | None, typer.Option("--port", help="port to bind (0: any free)")] = None,
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
    ray_engines: Annotated[
        int | None, typer.Option("--engines", help="with --ray: engines to start (default 1)")
    ] = None,
    engine_kind: Annotated[
        str | None, typer.Option("--engine-kind", help="with --ray: vllm (default) or standin")
    ] = None,
    engine_gpus: Annotated[
        int | None,
        typer.Option("--engine-gpus", help="with --ray: GPUs per engine (default --tp; 0: CPU)"),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="with --ray: cluster to join ('auto': a running one)"),
    ] = None,
    engine_model: Annotated[
        Path | None,
        typer.Option(
            "--engine-model",
            help="with --ray: the model directory every vLLM engine serves, on every node "
            "(default: Loom's tiny random-weight model)",
        ),
    ] = None,
    engine_args: Annotated[
        list[str] | None,
        typer.Option(
            "--engine-arg",
            help="with --ray: one more vLLM flag or value, repeatable, e.g. "
            "--engine-arg=--dtype --engine-arg=bfloat16 (later flags override Loom's)",
        ),
    ] = None,
) -> None:
    """Route the turns of rollout trajectories to inference engines, scheduled and placed by
    Heddle's policies or a baseline's."""
    from loom.core.errors import ConfigError
    from loom.runtime.rollout import RolloutServerConfig, load_config, serve
    from loom.runtime.rollout.config import parse_engine

    ray_flags = (ray_engines, engine_kind, engine_gpus, ray_address, engine_model, engine_args)
    if not ray and any(flag is not None for flag in ray_flags):
        raise typer.BadParameter(
            "--engines, --engine-kind, --engine-gpus, --engine-model, --engine-arg and "
            "--ray-address go with --ray"
        )
    try:
        base = load_config(config) if config is not None else RolloutServerConfig()
        defaults = {"tp": tp, "max_running": max_running}
        engines = None
        if engine:
            engines = tuple(parse_engine(spec, defaults) for spec in engine)
        settings = base.with_overrides(
            engines=engines,
            placement=placement,
            scheduler=scheduler,
            host=host,
            port=port,
            state_dir=state_dir,
            profiles=tuple(profile) if profile else None,
            tokenizer=tokenizer,
            **_access(token, allow_open, closed_health),
        )
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    from loom.runtime.access import warn_if_open

    warn_if_open(settings, "rollout router")
    if ray:
        ray_settings: dict[str, Any] = {
            "engines": ray_engines,
            "tp": tp,
            "max_running": max_running,
            "launcher": engine_kind,
            "gpus": engine_gpus,
            "address": ray_address,
            "host": host,
        }
        if engine_model is not None or engine_args:
            from loom.runtime.engine import EngineConfig as VllmConfig

            ray_settings["vllm"] = VllmConfig(
                model=engine_model.expanduser().resolve() if engine_model else None,
                served_model_name=engine_model.name if engine_model else "loom-tiny",
                extra_args=tuple(engine_args or ()),
            )
        _serve_rollout_on_ray(settings, {k: v for k, v in ray_settings.items() if v is not None})
        return
    serve(settings, announce=lambda line: console.log(line))


def _serve_rollout_on_ray(settings: RolloutServerConfig, ray_settings: dict[str, Any]) -> None:
    from loom.core.errors import ConfigError, LoomError
    from loom.runtime.rollout.ray_deploy import RayDeployConfig, serve_ray

    try:
        config = RayDeployConfig(**ray_settings)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        serve_ray(settings, config, announce=lambda line: console.log(line))
    except LoomError as exc:
        console.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None


run_app = typer.Typer(help="Run RL jobs through Loom's three levels.", no_args_is_help=True)
app.add_typer(run_app, name="run")


@run_app.command("grpo")
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
) -> None:
    """GRPO on a task with a verifiable reward, through the cluster service (training), the
    rollout router into vLLM engines whose weights follow training, and the action server's
    sandbox (tools, rewards)."""
    from loom.core.errors import ConfigError
    from loom.rl.grpo.cli import main as grpo_main

    try:
        grpo_main(
            config, steps=steps, out=out, seed=seed, baseline=baseline, compare=compare,
            console=console,
        )  # fmt: skip
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


plan_app = typer.Typer(help="Plan resources for Loom's runtime.", no_args_is_help=True)
app.add_typer(plan_app, name="plan")


@plan_app.command("rollout")
def plan_rollout(
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
        str | None,
        typer.Option("--model", help="roofline cost model without --profile (default qwen3-14b)"),
    ] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="GPU of that roofline (default h100)")
    ] = None,
    degrees: Annotated[str, typer.Option("--degrees", help="TP degrees to use")] = "1,2,4,8",
    seed: Annotated[int, typer.Option("--seed", help="seed of the annealing")] = 0,
    max_running: Annotated[
        int, typer.Option("--max-running", help="turns an engine runs at once")
    ] = 256,
    gpus_per_node: Annotated[
        int, typer.Option("--gpus-per-node", help="for device ids and engine hosts")
    ] = 8,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON object")] = False,
) -> None:
    """Print Heddle's annealed model-parallel layout for a GPU budget, planned for a batch like
    the history (its k=0 predicted lengths), and the engines to start from it."""

    from loom.core.errors import ConfigError
    from loom.rollout.history import read_history
    from loom.runtime.rollout import plan as rollout_plan

    if profile and (model is not None or gpu is not None):
        raise typer.BadParameter("--model/--gpu choose the roofline cost; --profile replaces it")
    try:
        degree_list = tuple(int(d) for d in degrees.split(",") if d.strip())
    except ValueError:
        raise typer.BadParameter(
            f"not a list of integers: {degrees!r}", param_hint="--degrees"
        ) from None
    try:
        trajs = read_history(history)
        settings = rollout_plan.PlanSettings(
            gpus=gpus,
            degrees=degree_list,
            profiles=tuple(profile or ()),
            model=model or "qwen3-14b",
            gpu=gpu or "h100",
            max_running=max_running,
            gpus_per_node=gpus_per_node,
            seed=seed,
        )
        plan = rollout_plan.plan_rollout(trajs, settings)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
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


@plan_app.command("example-history")
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
    from loom.core.errors import ConfigError
    from loom.rollout.history import write_history
    from loom.sim.workloads.agentic import AgenticWorkload

    try:
        wl = AgenticWorkload(
            kind=workload, model=model, num_prompts=prompts, samples=samples, prompt_seed=seed
        )
        count = write_history(out, wl.sample(epoch))
    except (ConfigError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from None
    console.print(f"wrote {count} trajectories ({workload.value}, {model}) to {out}")


@serve_app.command("engine")
def serve_engine(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", help="port to bind; 0 picks a free one")] = 0,
    host: Annotated[str, typer.Option("--host", help="address to bind")] = "127.0.0.1",
    max_running: Annotated[
        int | None,
        typer.Option(
            "--max-running",
            help="most requests decoding at once (default 16; emulated: 1024, the simulator's)",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir", help="cache the model under DIR/engine-model"),
    ] = None,
    emulate: Annotated[
        str | None,
        typer.Option(
            "--emulate",
            help="MODEL@GPU[:tpN] (e.g. qwen3-14b@h100:tp2): instead of vLLM, an engine that "
            "behaves like that GPU (the simulator's worker on a scaled wall clock), in vLLM's "
            "dialect; no model, no GPU",
        ),
    ] = None,
    time_scale: Annotated[
        float,
        typer.Option(
            "--time-scale",
            help="with --emulate: wall seconds per GPU second (0.1: ten times faster)",
        ),
    ] = 1.0,
    scheduling_policy: Annotated[
        str,
        typer.Option(
            "--scheduling-policy", help="with --emulate: priority (default) or fcfs, as vLLM's"
        ),
    ] = "priority",
    stream_interval_ms: Annotated[
        float,
        typer.Option(
            "--stream-interval-ms",
            help="with --emulate: wall milliseconds between a stream's chunks",
        ),
    ] = 50.0,
    priority: Annotated[
        bool,
        typer.Option(
            "--priority/--no-priority",
            help="schedule by the requests' `priority` field (vLLM --scheduling-policy "
            "priority; the router passes its scheduler's key there)",
        ),
    ] = True,
    memory: Annotated[
        float,
        typer.Option("--gpu-memory-utilization", help="share of host memory vLLM reserves"),
    ] = 0.1,
    cpus: Annotated[
        str,
        typer.Option(
            "--cpus",
            help="cores of its compute threads, e.g. 1 or 0-1 (VLLM_CPU_OMP_THREADS_BIND); "
            "give engines on one machine different cores: 'auto' puts each on the first",
        ),
    ] = "auto",
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
    config: ConfigOption = None,
    token: TokenOption = None,
    allow_open: AllowOpenOption = False,
) -> None:
    """Serve a tiny random-weight model with vLLM on the CPU (built once; nothing downloaded),
    or with --emulate an engine that behaves like a GPU."""
    import signal

    from loom.core.errors import ConfigError

    if emulate is not None:
        from loom.runtime.access import is_loopback

        if token is not None or config is not None:
            raise typer.BadParameter("--token and --config are not supported with --emulate")
        if not is_loopback(host) and not allow_open:
            raise typer.BadParameter(
                f"an emulated engine has no token: it binds loopback only (got --host {host}); "
                "--allow-open to bind beyond it anyway"
            )
        _serve_emulated(
            emulate, host, port, max_running, time_scale, scheduling_policy, stream_interval_ms
        )
        return
    max_running = 16 if max_running is None else max_running
    from loom.runtime.engine import (
        EngineConfig,
        EngineProcess,
        EngineStartError,
        EngineUnavailableError,
    )

    try:
        settings: dict[str, Any] = _read_table(config) if config is not None else {}
        given = dict(
            host=host,
            port=port,
            max_running=max_running,
            state_dir=state_dir,
            priority=priority,
            gpu_memory_utilization=memory,
            cpus=cpus,
            token=token,
            allow_open=allow_open,
            model=model,
            weight_sync=weight_sync,
        )
        # a flag left at its default does not override the file's setting
        flag_of = {"gpu_memory_utilization": "memory"}
        for key, value in given.items():
            # NOTE: by name: typer carries its own copy of click's ParameterSource
            source = ctx.get_parameter_source(flag_of.get(key, key))
            if key not in settings or getattr(source, "name", "") != "DEFAULT":
                settings[key] = value
        unknown = set(settings) - {f.name for f in dataclasses.fields(EngineConfig)}
        if unknown:
            raise ConfigError(f"unknown engine settings {sorted(unknown)}")
        cfg = EngineConfig(**settings)
    except (ConfigError, TypeError) as exc:
        raise typer.BadParameter(str(exc)) from None
    console.log("[bold]loom engine[/bold]: starting vLLM on the CPU (about a minute)")
    try:
        engine = EngineProcess.start(cfg)
    except (EngineUnavailableError, EngineStartError) as exc:
        console.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None
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


def _serve_emulated(
    spec: str,
    host: str,
    port: int,
    max_running: int | None,
    time_scale: float,
    scheduling_policy: str,
    stream_interval_ms: float,
) -> None:
    from loom.core.errors import ConfigError
    from loom.runtime.emulate.process import make_config
    from loom.runtime.emulate.server import serve

    try:
        cfg = make_config(
            spec,
            time_scale=time_scale,
            scheduling_policy=scheduling_policy,
            max_running=max_running,
            stream_interval_s=stream_interval_ms / 1000,
        )
    except (ConfigError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from None

    def announce(url: str) -> None:
        console.log(
            f"[bold]loom engine[/bold] on [link]{url}[/link] — emulated {cfg.spec}, time scale "
            f"{cfg.time_scale:g}, max running {cfg.max_running}, {cfg.scheduling_policy} "
            "scheduling"
        )
        console.print(url, highlight=False)

    serve(cfg, host, port, announce)


def _read_table(path: Path) -> dict[str, Any]:
    """A TOML or JSON file's settings table (for settings that are no pydantic model)."""
    import tomllib

    from loom.core.errors import ConfigError

    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix != ".json" else json.loads(text)
    except (OSError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must hold a table of settings")
    return data


if __name__ == "__main__":  # pragma: no cover
    app()
