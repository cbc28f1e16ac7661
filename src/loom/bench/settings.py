"""How a benchmark sets Loom's router over its engines (`RouterSetup`), and the same settings
as the simulator's served rollout sees them: the router's own settings (`simulated_router`)
and the engines' (`simulated_engines`) — so that a real run and a simulated run of one batch
differ only by what the HTTP path and the engines' wall clock add."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from loom.core.errors import ConfigError
from loom.core.topology import GpuType
from loom.rollout.policy import PlacementKind, SchedulerKind
from loom.runtime.rollout.config import EngineConfig, RolloutServerConfig, parse_engine

if TYPE_CHECKING:
    from loom.runtime.emulate.config import EmulatedEngineConfig

__all__ = [
    "BENCH_SETS",
    "RouterSetting",
    "RouterSettingError",
    "RouterSetup",
    "engine_spec",
    "router_config",
    "router_setting",
    "serve_flags",
    "simulated_engines",
    "simulated_router",
]

# the router settings each system and setting of the benchmark sets itself
BENCH_SETS = frozenset(
    {"placement", "scheduler", "engines", "profiles", "model", "gpu", "port", "host", "state_dir"}
)

RouterSetting = tuple[str, Any]


class RouterSettingError(argparse.ArgumentTypeError, ValueError):
    """A `--router-set KEY=VALUE` the benchmark cannot take, and why (argparse prints it)."""


def router_setting(text: str) -> RouterSetting:
    """KEY=VALUE for `--router-set`: VALUE as JSON where it parses (numbers, true), else text;
    KEY one of the router's settings (`loom serve rollout --config`) and not one the
    benchmark sets itself (`BENCH_SETS`); VALUE one that setting takes."""
    key, eq, raw = text.partition("=")
    key = key.strip()
    if not eq or not key:
        raise RouterSettingError(f"{text!r}: expected KEY=VALUE, e.g. refit_every=100000")
    if key in BENCH_SETS:
        raise RouterSettingError(
            f"{text!r}: the benchmark sets {key} itself (for a system, --systems)"
        )
    if key not in RolloutServerConfig.model_fields:
        known = ", ".join(sorted(set(RolloutServerConfig.model_fields) - BENCH_SETS))
        raise RouterSettingError(f"{text!r}: {key} is not a setting of the router; one of {known}")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    try:
        RolloutServerConfig.model_validate({key: value})
    except ValidationError as exc:
        why = "; ".join(str(e["msg"]) for e in exc.errors())
        raise RouterSettingError(f"{text!r}: {key} cannot be {value!r}: {why}") from None
    return key, value


@dataclass(frozen=True, kw_only=True)
class RouterSetup:
    """Loom's router as a benchmark sets it: each engine's `max_running` turns in flight and
    `queue` beyond them; its degree `tp` and whether it takes the scheduler's key as its
    `priority` (said explicitly: emulated engines schedule by it); the cost model Heddle's
    placement plans with (`model` on `gpu`, or measured `profiles`); and the router settings
    of `--router-set` (`settings`)."""

    max_running: int
    queue: int = 0
    tp: int = 1
    priority: bool = False
    slots: tuple[tuple[int, int], ...] = ()  # each engine's (degree, node); () every `tp`, 0
    model: str | None = None
    gpu: str | None = None
    profiles: tuple[Path, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (
            self.max_running < 1
            or self.queue < 0
            or self.tp < 1
            or any(tp < 1 or node < 0 for tp, node in self.slots)
        ):
            raise ConfigError(
                f"max_running and tp must be >= 1 and queue >= 0, got {self.max_running}, "
                f"{self.tp}, {self.queue}"
            )
        if (self.model is None) != (self.gpu is None):
            raise ConfigError("model and gpu come together (the roofline of a model on a GPU)")
        taken = sorted(set(self.settings) & BENCH_SETS)
        if taken:
            raise ConfigError(f"the benchmark sets {', '.join(taken)} itself")
        object.__setattr__(self, "settings", MappingProxyType(dict(self.settings)))

    def slot(self, i: int) -> tuple[int, int]:
        """Engine `i`'s degree and node."""
        return self.slots[i] if self.slots else (self.tp, 0)

    def cost_model(self) -> dict[str, Any]:
        """The settings a router of this setup gets beside its system's and engines: those of
        `--router-set`, and the roofline model of the emulated GPU."""
        out = dict(self.settings)
        if self.model is not None:
            out |= {"model": self.model, "gpu": self.gpu}
        return out


def engine_spec(url: str, setup: RouterSetup, i: int = 0) -> str:
    """Engine `i` as `loom serve rollout --engine` takes it."""
    spec = f"{url},max_running={setup.max_running}"
    if setup.queue:  # turns beyond the cap that wait in the engine's own queue
        spec += f",queue={setup.queue}"
    if setup.priority:  # the GPU's degree for Heddle's placement; the key as vLLM's priority
        tp, node = setup.slot(i)
        spec += f",tp={tp},node={node},priority"
    return spec


def router_config(
    setup: RouterSetup,
    placement: str,
    scheduler: str,
    urls: Sequence[str],
    *,
    state_dir: Path | None = None,
    port: int = 0,
) -> RolloutServerConfig:
    """The settings of a router of `setup` under a system's placement and scheduler, over the
    engines at `urls` (a router in this process)."""
    return RolloutServerConfig(
        port=port,
        placement=PlacementKind(placement),
        scheduler=SchedulerKind(scheduler),
        profiles=setup.profiles,
        state_dir=state_dir,
        engines=tuple(
            EngineConfig.model_validate(parse_engine(engine_spec(u, setup, i)))
            for i, u in enumerate(urls)
        ),
        **setup.cost_model(),
    )


def serve_flags(
    setup: RouterSetup,
    placement: str,
    scheduler: str,
    urls: Sequence[str],
    *,
    state_dir: Path,
    config: Path | None,
) -> list[str]:
    """The same router as `loom serve rollout` flags (but `--port`); `config`: the file the
    cost model's settings are written to (`RouterSetup.cost_model`), where there are any."""
    flags = ["--placement", placement, "--scheduler", scheduler, "--state-dir", str(state_dir)]
    for i, url in enumerate(urls):
        flags += ["--engine", engine_spec(url, setup, i)]
    for profile in setup.profiles:
        flags += ["--profile", str(profile)]
    values = setup.cost_model()
    if values:
        if config is None:
            raise ConfigError(f"settings {sorted(values)} need a config file to go in")
        config.write_text(json.dumps(values))
        flags += ["--config", str(config)]
    return flags


def simulated_router(
    setup: RouterSetup, placement: str, scheduler: str, n_engines: int
) -> RolloutServerConfig:
    """The settings the simulator's router policies read (`make_router`): the system's
    placement and scheduler, the cost model and `--router-set` of `setup`, and `n_engines`
    engines of its `max_running` and `tp` (the driver's settings have no effect there)."""
    return RolloutServerConfig(
        placement=PlacementKind(placement),
        scheduler=SchedulerKind(scheduler),
        profiles=setup.profiles,
        engines=tuple(
            EngineConfig(
                url=f"http://sim{i}",
                max_running=setup.max_running,
                queue=setup.queue,
                tp=setup.slot(i)[0],
                node=setup.slot(i)[1],
            )
            for i in range(n_engines)
        ),
        **setup.cost_model(),
    )


def simulated_engines(
    setup: RouterSetup,
    n_engines: int,
    *,
    max_running: int | None = None,
    decode_reserve: int | None = None,
) -> list[EmulatedEngineConfig]:
    """The engines of `setup` as the simulator's served rollout runs them (the emulated
    engine's state): the emulated GPU's model, type and degree (a profile's latency model
    replaces the roofline where the setup has profiles: `simulate`); `max_running` requests
    each (default: the router's cap); `decode_reserve` KV tokens a request reserves (default:
    the emulated engine's); scheduling by the request's priority where the setup sends it."""
    from loom.rollout.engine_queue import EngineSchedulingPolicy
    from loom.runtime.emulate.config import EmulatedEngineConfig, EmulationSpec

    default = EmulationSpec.parse(DEFAULT_EMULATION)
    model, gpu = setup.model or default.model, GpuType(setup.gpu or default.gpu)
    values: dict[str, Any] = {
        "max_running": setup.max_running if max_running is None else max_running,
        "scheduling_policy": EngineSchedulingPolicy.PRIORITY
        if setup.priority
        else EngineSchedulingPolicy.FCFS,
    }
    if decode_reserve is not None:
        values["decode_reserve"] = decode_reserve
    return [
        EmulatedEngineConfig(
            spec=EmulationSpec(model=model, gpu=gpu, tp=setup.slot(i)[0]),
            node=setup.slot(i)[1],
            **values,
        )
        for i in range(n_engines)
    ]


# what names a profiled engine's emulation (its timing and KV capacity are the profile's)
DEFAULT_EMULATION = "qwen3-8b@h100"
