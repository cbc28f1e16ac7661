"""The router's policies built from its settings: the placement (`make_router`, Heddle's with
its cost per degree), the engines' latency models by degree (what the move rule weighs a
prefill by), and the core's settings. The served router and the simulator build them alike."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec
from loom.perf.latency import LatencyModel
from loom.rollout.heddle.planner import DegreeCostModel, decode_context
from loom.rollout.heddle.router import HeddleRouter
from loom.rollout.policy import ROUTERS, SCHEDULERS, PlacementKind, Router, TurnScheduler
from loom.runtime.rollout.config import RolloutServerConfig
from loom.runtime.rollout.core import CoreSettings, RouterCore
from loom.runtime.rollout.move_rule import MoveRule

__all__ = [
    "check_config",
    "default_cost",
    "latency_models",
    "make_core",
    "make_router",
    "stable_id",
]


def stable_id(value: str) -> int:
    """A prompt's id from its text or name, the same in every process."""
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=7).digest(), "big")


def default_cost(
    config: RolloutServerConfig, history: Sequence[TrajectorySpec] = ()
) -> Callable[[int], Any]:
    """Heddle's placement cost per degree: from measured engine profiles where given, else
    the roofline model of `config.model` on `config.gpu`. F counts the router's admission:
    beyond the engines' `max_running` turns queue. The typical resident context is the
    history's (`decode_context`); with none, 8k tokens is assumed."""
    context = decode_context(history) if history else 8192
    running = min((e.max_running for e in config.engines if e.max_running), default=64)
    if config.profiles:
        from loom.runtime.rollout.cost import ProfiledDegreeCost

        try:
            return ProfiledDegreeCost.load(
                config.profiles, context_per_seq=context, max_group=4096, max_running=running
            )
        except OSError as exc:
            msg = f"cannot read engine profile {exc.filename}: {exc.strerror}"
            raise ConfigError(msg) from None
    from loom.core.topology import GpuType

    return DegreeCostModel(
        gpu=GpuType(config.gpu),
        model=config.model,
        context_per_seq=context,
        max_group=4096,
        max_running=running,
    )


def latency_models(config: RolloutServerConfig) -> Callable[[int], LatencyModel | None]:
    """The engines' latency model by tensor-parallel degree, what a prefill again costs: the
    profile of that degree where `profiles` are given, else the roofline model of `model`
    on `gpu` (None where neither fits the degree)."""
    from loom.perf.latency import ProfiledLatencyModel, RooflineLatencyModel

    profiled: dict[int, LatencyModel] = {}
    for path in config.profiles:
        try:
            lat = ProfiledLatencyModel.load(path)
        except OSError as exc:
            raise ConfigError(
                f"cannot read engine profile {exc.filename}: {exc.strerror}"
            ) from None
        profiled[lat.tp] = lat
    cache: dict[int, LatencyModel | None] = {}

    def model(tp: int) -> LatencyModel | None:
        if tp not in cache:
            if profiled:
                cache[tp] = profiled.get(tp)
            else:
                try:
                    cache[tp] = RooflineLatencyModel(config.gpu, config.model, tp)
                except ConfigError:
                    cache[tp] = None
        return cache[tp]

    return model


def make_router(
    config: RolloutServerConfig,
    cost: Callable[[int], Any] | None = None,
    history: Sequence[TrajectorySpec] = (),
) -> Router:
    if config.placement is PlacementKind.HEDDLE:
        return HeddleRouter(cost or default_cost(config, history))
    if config.placement is PlacementKind.ROSE:
        rose: Router = ROUTERS.get(config.placement)(
            cap_per_gpu=config.rose_cap_per_gpu, lease_s=config.rose_lease_s
        )
        return rose
    router: Router = ROUTERS.get(config.placement)()
    return router


def make_core(
    config: RolloutServerConfig,
    *,
    router: Router | None = None,
    scheduler: TurnScheduler | None = None,
    prior: Callable[[int, int], float] | None = None,
    history: Sequence[TrajectorySpec] = (),
) -> RouterCore:
    """The router's core with the policies `config` names (or those given)."""
    kwargs: dict[str, Any] = {} if prior is None else {"prior": prior}
    return RouterCore(
        CoreSettings.of(config),
        router=router or make_router(config, history=history),
        scheduler=scheduler or SCHEDULERS.get(config.scheduler)(),
        moves=MoveRule(latency_models(config), move_kv=config.move_kv),
        **kwargs,
    )


def check_config(config: RolloutServerConfig) -> None:
    """Fail early on settings the router cannot use."""
    ids = [e.id for e in config.engines if e.id is not None]
    if len(ids) != len(set(ids)):
        raise ConfigError(f"engine ids must be unique, got {ids}")
    urls = [e.url for e in config.engines]
    if len(urls) != len(set(urls)):
        raise ConfigError(f"engine urls must be unique, got {urls}")
