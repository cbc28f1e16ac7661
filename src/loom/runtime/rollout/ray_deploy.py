"""The rollout router and its engines on a Ray cluster: the router as a named actor, the
engines as actors in one placement group, each registering with the router as it comes up.

Whose the deployment is. By default the actors and the placement group belong to the driver
that deployed them (`loom serve rollout --ray`, a training script): Ray ends them when that
driver exits or dies, SIGKILL included, and each engine's process ends with its actor (the
engine is tethered to the actor's worker: `loom.proc.tether`), so a killed driver leaves no
router answering and no GPUs reserved. `detached=True` makes a deployment that outlives its
driver, for other drivers to `connect()` to; it runs until one of them shuts it down.

How engines map to bundles. Each engine is ONE bundle, `{"GPU": tp, "CPU": cpus}`, and
one actor that holds all of it; the engine's process (with its tensor-parallel workers, vLLM's
multiprocessing executor) inherits the actor's CUDA_VISIBLE_DEVICES. Ray places a bundle on a
single node, so an engine's TP group never spans nodes: that is STRICT_PACK within an engine,
without a placement group per engine. (The alternative, tp bundles of one GPU under STRICT_PACK
per engine, suits engines that start one Ray worker per GPU, as vLLM's Ray executor does; the
engines here start their own workers.) One group for all engines makes the reservation all or
nothing: a deployment that does not fit fails as a whole, rather than half of it serving.

Across engines the group's strategy is PACK by default: engines fill nodes before taking new
ones, leaving whole nodes to training and keeping the router's migrations (a recomputed prefix
on another engine) within a node where it can. SPREAD puts engines on as many nodes as it can
(one node lost takes fewer engines); STRICT_SPREAD requires a node per engine.

    with deploy(RayDeployConfig(engines=2, tp=2)) as rollout:
        print(rollout.url)  # http://<node ip>:8800; clients call it as any router
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from types import ModuleType, TracebackType
from typing import Any

from loom.core.errors import ConfigError, LoomError
from loom.core.extras import Extra, install_line
from loom.runtime.engine.launcher import EngineConfig as VllmConfig
from loom.runtime.rollout.config import RolloutServerConfig
from loom.runtime.rollout.ray_actors import EngineActor, EngineLauncher, EngineSpec, RouterActor

__all__ = [
    "RAY_INSTALL_HINT",
    "DeployError",
    "EngineLauncher",
    "GroupStrategy",
    "PlacementError",
    "RayDeployConfig",
    "RayRollout",
    "RayUnavailableError",
    "connect",
    "deploy",
    "require_ray",
    "serve_ray",
]

log = logging.getLogger(__name__)

RAY_INSTALL_HINT = install_line(Extra.RAY)
_WATCH_S = 5.0


class RayUnavailableError(LoomError, ImportError):
    """Ray (the `ray` extra) is not installed."""


class DeployError(LoomError, RuntimeError):
    """The deployment could not start; whatever it had started is torn down."""


class PlacementError(DeployError):
    """The cluster did not reserve the engines' placement group in time."""


def require_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise RayUnavailableError(f"Ray is not installed; {RAY_INSTALL_HINT}") from None
    return ray


class GroupStrategy(StrEnum):
    """How the placement group spreads engines over nodes (each engine is one node anyway)."""

    PACK = "PACK"
    SPREAD = "SPREAD"
    STRICT_SPREAD = "STRICT_SPREAD"


@dataclass(frozen=True, kw_only=True)
class RayDeployConfig:
    """The engines of a Ray deployment and where its actors live. The router's own settings
    (policies, port, state dir) are a `RolloutServerConfig`; its `host` is replaced by `host`."""

    engines: int = field(default=1, metadata={"help": "engines to start"})
    tp: int = field(default=1, metadata={"help": "tensor-parallel degree of each engine"})
    gpus: int | None = field(
        default=None,
        metadata={"help": "GPUs reserved per engine; None: its TP degree; 0: CPU engines"},
    )
    cpus: float = field(default=1.0, metadata={"help": "CPUs reserved per engine"})
    launcher: EngineLauncher = field(
        default=EngineLauncher.VLLM, metadata={"help": "vllm, or standin (tests, no model)"}
    )
    max_running: int = field(
        default=16, metadata={"help": "turns in flight per engine, at the engine and router"}
    )
    strategy: GroupStrategy = field(
        default=GroupStrategy.PACK, metadata={"help": "spread of engines over nodes"}
    )
    name: str = field(default="loom-rollout-router", metadata={"help": "the router actor's name"})
    namespace: str = field(default="loom", metadata={"help": "Ray namespace of the actors"})
    detached: bool = field(
        default=False,
        metadata={
            "help": "outlive the driver that deploys it (until connect(...).shutdown()); "
            "False: Ray ends the actors and the placement group when the driver exits or dies"
        },
    )
    host: str | None = field(
        default=None, metadata={"help": "address every actor binds; None: its node's IP"}
    )
    address: str | None = field(
        default=None,
        metadata={
            "help": "ray.init(address=...) if Ray is not initialised ('auto': a running "
            "cluster; None: RAY_ADDRESS or a new local one)"
        },
    )
    router_cpus: float = field(
        default=0.0, metadata={"help": "CPUs reserved for the router (an I/O loop; 0: none)"}
    )
    placement_timeout_s: float = field(
        default=60.0, metadata={"help": "seconds to wait for the placement group"}
    )
    engine_timeout_s: float = field(
        default=900.0, metadata={"help": "seconds to wait for every engine to join"}
    )
    vllm: VllmConfig | None = field(
        default=None, metadata={"help": "template of the vLLM engines (host, port, tp set here)"}
    )
    standin_args: tuple[str, ...] = field(
        default=(), metadata={"help": "extra flags of the stand-in engines, e.g. --step-ms 2"}
    )

    def __post_init__(self) -> None:
        for name in ("engines", "tp", "max_running"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.gpus is not None and self.gpus < 0:
            raise ConfigError(f"gpus must be >= 0, got {self.gpus}")
        if self.cpus < 0 or self.router_cpus < 0:
            raise ConfigError(f"cpus must be >= 0, got {self.cpus} and {self.router_cpus}")
        if not self.bundle():
            raise ConfigError("an engine must reserve some GPUs or CPUs")
        if self.placement_timeout_s <= 0 or self.engine_timeout_s <= 0:
            raise ConfigError("timeouts must be > 0")
        if not self.name or "/" in self.name:
            raise ConfigError(f"name must be non-empty and without '/', got {self.name!r}")
        for name, kind in (("launcher", EngineLauncher), ("strategy", GroupStrategy)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, kind(value))
            except ValueError:
                choices = ", ".join(k.value for k in kind)
                raise ConfigError(f"{name} must be one of {choices}, got {value!r}") from None

    @property
    def lifetime(self) -> str | None:
        """Ray's `lifetime` of the actors and the placement group."""
        return "detached" if self.detached else None

    @property
    def engine_gpus(self) -> int:
        return self.tp if self.gpus is None else self.gpus

    def bundle(self) -> dict[str, float]:
        """One engine's reservation."""
        res = {"GPU": float(self.engine_gpus), "CPU": float(self.cpus)}
        return {k: v for k, v in res.items() if v > 0}

    def engine_name(self, i: int) -> str:
        return f"{self.name}/engine-{i}"


class RayRollout:
    """A running deployment: the router's `url`, its actor, the engine actors and their
    placement group. `shutdown()` (or leaving the `with` block) tears it all down."""

    def __init__(
        self,
        ray: ModuleType,
        *,
        url: str,
        router: Any | None,
        engines: list[Any],
        placement_group: Any,
    ) -> None:
        self.ray = ray  # the ray module
        self.url = url
        self.router = router
        self.engines = engines
        self.placement_group = placement_group
        self.joined: list[dict[str, Any]] = []  # id, url, node_ip, gpu_ids of joined engines
        self._pending: list[Any] = []  # engines' start() calls, each done once it joined
        self._down = False

    def wait_engines(
        self, timeout_s: float, on_join: Callable[[dict[str, Any]], None] | None = None
    ) -> list[dict[str, Any]]:
        """Block until every engine has joined the router (each as soon as it is up); raise
        DeployError if one fails or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while self._pending:
            left = max(0.0, deadline - time.monotonic())
            done, self._pending = self.ray.wait(self._pending, num_returns=1, timeout=left)
            if not done:
                raise DeployError(
                    f"{len(self._pending)} of {len(self.engines)} engines had not joined the "
                    f"router after {timeout_s:.0f} s"
                )
            try:
                info = self.ray.get(done[0])
            except self.ray.exceptions.RayError as exc:
                raise DeployError(f"an engine did not start: {exc}") from None
            self.joined.append(info)
            log.info("engine %s at %s joined the router", info["id"], info["url"])
            if on_join is not None:
                on_join(info)
        return self.joined

    def stats(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """The router's `/v1/stats`, through its actor."""
        assert self.router is not None, "the router actor was not started"
        stats: dict[str, Any] = self.ray.get(self.router.stats.remote(), timeout=timeout_s)
        return stats

    def ping(self, timeout_s: float = 60.0) -> None:
        """Raise DeployError if the router's actor has died."""
        assert self.router is not None, "the router actor was not started"
        try:
            self.ray.get(self.router.url.remote(), timeout=timeout_s)
        except self.ray.exceptions.RayActorError as exc:
            raise DeployError(f"the router's actor died: {exc}") from None

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the router (in-flight turns end), stop every engine process, kill the actors
        and remove the placement group. Safe to call twice."""
        if self._down:
            return
        self._down = True
        ray = self.ray
        actors = [a for a in (self.router, *self.engines) if a is not None]
        stops = [a.stop.remote() for a in actors]
        deadline = time.monotonic() + timeout_s
        for ref in stops:
            try:
                ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            except ray.exceptions.RayError as exc:  # dead, or slow: killed below anyway
                log.warning("stopping an actor of the deployment: %s", exc)
        for actor in actors:
            with contextlib.suppress(ray.exceptions.RayError, ValueError):
                ray.kill(actor, no_restart=True)
        if self.placement_group is not None:
            with contextlib.suppress(ray.exceptions.RayError, ValueError):
                ray.util.remove_placement_group(self.placement_group)
        self._pending = []

    # ---- steps of deploy() -----------------------------------------------------------------

    def _start_router(self, config: RayDeployConfig, settings: RolloutServerConfig) -> None:
        self.router = (
            self.ray.remote(RouterActor)
            .options(
                name=config.name,
                namespace=config.namespace,
                lifetime=config.lifetime,
                num_cpus=config.router_cpus,
                max_restarts=0,
            )
            .remote(settings, config.host)
        )
        self.url = self.ray.get(self.router.url.remote(), timeout=120)

    def _start_engines(self, config: RayDeployConfig) -> None:
        """One actor per bundle; each starts its engine and joins the router (not awaited).
        The router records them first, so that connect() finds every actor started."""
        from ray.util.placement_group import placement_group_table
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        assert self.router is not None, "start the router first"
        names = [config.engine_name(i) for i in range(config.engines)]
        record = {"placement_group": self.placement_group, "engines": names}
        self.ray.get(self.router.remember.remote(record), timeout=60)
        node_of = placement_group_table(self.placement_group)["bundles_to_node_id"]
        nodes = list(dict.fromkeys(node_of[i] for i in range(config.engines)))
        remote = self.ray.remote(EngineActor)
        for i, name in enumerate(names):
            spec = EngineSpec(
                id=f"ray-e{i}",
                launcher=config.launcher,
                tp=config.tp,
                max_running=config.max_running,
                node=nodes.index(node_of[i]),
                host=config.host,
                vllm=config.vllm,
                standin_args=config.standin_args,
            )
            actor = remote.options(
                name=name,
                namespace=config.namespace,
                lifetime=config.lifetime,
                num_gpus=config.engine_gpus,
                num_cpus=config.cpus,
                max_concurrency=2,  # stop() while start() runs
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=i
                ),
            ).remote(spec)
            self.engines.append(actor)
            self._pending.append(actor.start.remote(self.url))

    def __enter__(self) -> RayRollout:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()


def deploy(
    config: RayDeployConfig | None = None,
    router: RolloutServerConfig | None = None,
    *,
    wait: bool = True,
) -> RayRollout:
    """Reserve the engines' placement group, start the router actor, then the engine actors,
    each of which registers with the router once its engine is healthy: the router serves
    from the start and engines join it as they come up. With `wait`, returns once all have
    joined. Starts (or joins) Ray if this process has not. Raises RayUnavailableError without
    Ray, PlacementError when the cluster cannot place the engines in time, DeployError when
    the name is taken or an actor fails (having torn down what it started)."""
    config = config or RayDeployConfig()
    ray = require_ray()
    _init(ray, config.address, config.namespace)
    with contextlib.suppress(ValueError):
        ray.get_actor(config.name, namespace=config.namespace)
        raise DeployError(
            f"a deployment named {config.name!r} runs in namespace {config.namespace!r}; "
            "connect() to it or shut it down first"
        )
    pg = _reserve(ray, config)
    rollout = RayRollout(ray, url="", router=None, engines=[], placement_group=pg)
    try:
        rollout._start_router(config, router or RolloutServerConfig())
        rollout._start_engines(config)
        if wait:
            rollout.wait_engines(config.engine_timeout_s)
    except ray.exceptions.RayError as exc:
        rollout.shutdown(timeout_s=10.0)
        raise DeployError(f"the deployment did not start: {exc}") from None
    except BaseException:
        rollout.shutdown(timeout_s=10.0)
        raise
    return rollout


def connect(
    name: str = "loom-rollout-router", namespace: str = "loom", address: str | None = "auto"
) -> RayRollout:
    """The deployment named `name`, from any driver of the cluster (joining the cluster at
    `address` if this process is not in one yet); DeployError if there is none. A deployment
    that is not detached lives only as long as the driver that deployed it."""
    ray = require_ray()
    _init(ray, address, namespace)
    try:
        router = ray.get_actor(name, namespace=namespace)
    except ValueError:
        raise DeployError(f"no deployment named {name!r} in namespace {namespace!r}") from None
    record = ray.get(router.record.remote(), timeout=60)
    engines = []
    for engine_name in record.get("engines", ()):
        with contextlib.suppress(ValueError):
            engines.append(ray.get_actor(engine_name, namespace=namespace))
    url = ray.get(router.url.remote(), timeout=60)
    return RayRollout(
        ray,
        url=url,
        router=router,
        engines=engines,
        placement_group=record.get("placement_group"),
    )


def serve_ray(
    settings: RolloutServerConfig,
    config: RayDeployConfig,
    announce: Callable[[str], None] = print,
) -> None:
    """`loom serve rollout --ray`: deploy, announce the router and each engine as it joins,
    and tear the deployment down on SIGINT or SIGTERM."""
    ray = require_ray()
    # Ray's core worker installs its own SIGTERM handler at init, which dies without tearing
    # anything down (Ray would end our actors, but not say so, nor stop the router's turns
    # gracefully): ours goes after. A SIGKILL ends them too: they are not detached.
    _init(ray, config.address, config.namespace)
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        _serve(settings, config, announce)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _serve(
    settings: RolloutServerConfig, config: RayDeployConfig, announce: Callable[[str], None]
) -> None:
    rollout = deploy(config, settings, wait=False)
    try:
        announce(
            f"Loom rollout router on {rollout.url} (Ray actor {config.namespace}/{config.name}; "
            f"{settings.placement.value} + {settings.scheduler.value}); starting "
            f"{config.engines} {config.launcher.value} engines of TP {config.tp}"
        )
        rollout.wait_engines(
            config.engine_timeout_s,
            on_join=lambda e: announce(
                f"engine {e['id']} joined: {e['url']} (node {e['node_ip']}, "
                f"GPUs {','.join(e['gpu_ids']) or 'none'})"
            ),
        )
        announce("every engine joined; Ctrl-C stops the deployment")
        while True:  # until interrupted, or the router's actor dies
            time.sleep(_WATCH_S)
            rollout.ping()
    except KeyboardInterrupt:
        pass
    finally:
        rollout.shutdown()
        announce(f"stopped the router and {len(rollout.engines)} engines; placement group removed")


# ---- helpers -------------------------------------------------------------------------------


def _init(ray: ModuleType, address: str | None, namespace: str) -> None:
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, namespace=namespace)
    except ConnectionError as exc:
        raise DeployError(f"cannot reach the Ray cluster at {address!r}: {exc}") from None


def _reserve(ray: ModuleType, config: RayDeployConfig) -> Any:
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = config.bundle()
    pg = placement_group(
        [bundle] * config.engines,
        strategy=config.strategy.value,
        name=f"{config.name}/engines",
        lifetime=config.lifetime,
    )
    if pg.wait(timeout_seconds=config.placement_timeout_s):
        return pg
    remove_placement_group(pg)
    raise PlacementError(
        f"the cluster did not place {config.engines} engines of {_fmt(bundle)} each "
        f"({config.strategy.value}; an engine's GPUs on one node) within "
        f"{config.placement_timeout_s:.0f} s: it has {_fmt(ray.cluster_resources())} "
        f"({_fmt(ray.available_resources())} free), at most {_fmt(_largest_node(ray))} on "
        "one node. Start fewer or smaller engines, or reserve no GPUs for CPU engines."
    )


def _largest_node(ray: ModuleType) -> dict[str, float]:
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    return max(nodes, key=lambda r: (r.get("GPU", 0.0), r.get("CPU", 0.0)), default={})


def _fmt(resources: dict[str, float]) -> str:
    shown = {k: v for k, v in resources.items() if k in ("GPU", "CPU")}
    return ", ".join(f"{k} {v:g}" for k, v in sorted(shown.items(), reverse=True)) or "nothing"
