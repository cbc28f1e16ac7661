"""The rollout systems a benchmark compares, one kind per class behind one interface
(`System`): Loom's router under a system's placement and scheduler (heddle, verl, slime,
verl* and ablations), and sglang-router under one of its policies (peers); each runs the same
batch over the same engines, through a fresh router per run."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loom.bench.batch import Batch, Draws
from loom.bench.fleet import Fleet
from loom.bench.measure import cpu_spent, run_window
from loom.bench.peers import PEERS as PEER_ROUTERS
from loom.bench.replay import MODEL, run_batch, run_peer_batch, vocabulary, wait_fitted
from loom.bench.routers import PeerRouter, Router, ServedRouter, ThreadRouter
from loom.bench.settings import RouterSetup, router_config, serve_flags
from loom.runtime.rollout.prediction import HISTORY_FILE

__all__ = [
    "BASELINES",
    "PEERS",
    "SYSTEMS",
    "Bench",
    "InProcess",
    "Launch",
    "LoomSystem",
    "PeerSystem",
    "Served",
    "System",
    "UnknownSystemError",
    "system",
]


class Launch(ABC):
    """How a Loom system's router runs."""

    @abstractmethod
    def router(self, bench: Bench, system: LoomSystem, state: Path) -> Router: ...


class Served(Launch):
    """As users run it, and as the peer runs: `loom serve rollout` in a process of its own."""

    def router(self, bench: Bench, system: LoomSystem, state: Path) -> Router:
        flags = serve_flags(
            system.setup(bench.setup),
            system.placement,
            system.scheduler,
            bench.fleet.urls,
            state_dir=state,
            config=state / "router.json",
        )
        return ServedRouter(flags)


class InProcess(Launch):
    """In a thread of this process: its CPU counts as the agents'."""

    def router(self, bench: Bench, system: LoomSystem, state: Path) -> Router:
        config = router_config(
            system.setup(bench.setup),
            system.placement,
            system.scheduler,
            bench.fleet.urls,
            state_dir=state if bench.history else None,
        )
        return ThreadRouter(config)


@dataclass(frozen=True, kw_only=True)
class Bench:
    """What every run of one benchmark shares: its engines, how Loom's router is set over
    them and launched, and `work`, a directory holding the history file of `history`
    trajectories (none: 0) from which each run's router starts."""

    fleet: Fleet
    setup: RouterSetup
    work: Path
    history: int = 0
    launch: Launch = Served()  # noqa: RUF009 (a stateless strategy)
    model: str = MODEL

    @property
    def scale(self) -> float:
        return self.fleet.time_scale


class System(ABC):
    """A named rollout system. `policies`: its (placement, scheduler) where they are Loom's
    (the rollout simulator runs them too), else None."""

    name: str

    @property
    @abstractmethod
    def policies(self) -> tuple[str, str] | None: ...

    def setup(self, base: RouterSetup) -> RouterSetup:
        """Loom's router as this system sets it over the benchmark's `base`."""
        return base

    @abstractmethod
    def run(self, bench: Bench, batch: Batch, draws: Draws) -> dict[str, Any]:
        """One run of the batch through a fresh router of this system: `system`, the
        replay's outcome (`loom.bench.replay`), the run window's (`loom.bench.measure`) and
        `router_cpu_s` where the router has a process of its own."""


@dataclass(frozen=True)
class LoomSystem(System):
    """Loom's router under `placement` and `scheduler`, with router `settings` of its own
    over the benchmark's (an ablation: `move_kv` off)."""

    name: str
    placement: str
    scheduler: str
    settings: tuple[tuple[str, Any], ...] = ()

    @property
    def policies(self) -> tuple[str, str]:
        return self.placement, self.scheduler

    def setup(self, base: RouterSetup) -> RouterSetup:
        if not self.settings:
            return base
        return replace(base, settings={**base.settings, **dict(self.settings)})

    def run(self, bench: Bench, batch: Batch, draws: Draws) -> dict[str, Any]:
        state = Path(tempfile.mkdtemp(dir=bench.work))
        if bench.history:
            shutil.copyfile(bench.work / HISTORY_FILE, state / HISTORY_FILE)
        with bench.launch.router(bench, self, state) as router:
            wait_fitted(router.url, bench.history)
            return {"system": self.name, **_measured(bench, router, batch, draws, None)}


@dataclass(frozen=True)
class PeerSystem(System):
    """A peer router (`loom.bench.peers`) under `policy`. sglang-router's OpenAI route takes
    text prompts only, so the agents send every peer the context as text of the engines'
    word-level vocabulary."""

    name: str
    peer: str
    policy: str

    @property
    def policies(self) -> None:
        return None

    def run(self, bench: Bench, batch: Batch, draws: Draws) -> dict[str, Any]:
        words = asyncio.run(vocabulary(bench.fleet.urls[0], bench.model))
        with PeerRouter(self.peer, bench.fleet.urls, self.policy) as router:
            return {"system": self.name, **_measured(bench, router, batch, draws, words)}


def _measured(
    bench: Bench, router: Router, batch: Batch, draws: Draws, words: list[str] | None
) -> dict[str, Any]:
    """The batch through `router` (Loom's, or with `words` a peer's), its CPU and time."""
    pid = router.pid
    with contextlib.ExitStack() as stack:
        used = stack.enter_context(cpu_spent(pid)) if pid is not None else None
        window = stack.enter_context(run_window(bench.fleet))
        if words is None:
            row = asyncio.run(run_batch(router.url, batch, draws, bench.scale))
        else:
            row = asyncio.run(
                run_peer_batch(router.url, batch, draws, words, bench.scale, bench.model)
            )
    if used is not None:
        row["router_cpu_s"] = used()
    return {**row, **window}


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        LoomSystem("heddle", "heddle", "pps"),
        LoomSystem("verl", "cache_aware", "rr"),
        LoomSystem("slime", "least_load", "rr"),
        LoomSystem("verl*", "hybrid", "rr"),
        # ablations: Heddle's placement alone, PPS alone, Heddle without moving KV
        LoomSystem("heddle-placement", "heddle", "rr"),
        LoomSystem("heddle-nokv", "heddle", "pps", (("move_kv", False),)),
        LoomSystem("pps-only", "least_load", "pps"),
        # peers: the same batch through each peer router with each of its policies
        *(
            PeerSystem(f"{peer.name}:{policy}", peer.name, policy)
            for peer in PEER_ROUTERS.values()
            for policy in peer.policies
            if policy != "random"
        ),
    )
}
BASELINES = ("verl", "slime", "verl*")  # the RL frameworks' own routing, Heddle's targets
PEERS = tuple(name for name, s in SYSTEMS.items() if s.policies is None)


class UnknownSystemError(ValueError):
    """A system name not in `SYSTEMS`."""


def system(name: str) -> System:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise UnknownSystemError(f"unknown system {name!r}; one of {', '.join(SYSTEMS)}") from None
