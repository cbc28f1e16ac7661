"""How the cluster service starts a deployment's worker group, one class per way: worker
processes beside each node group's StateManager sidecar (`ProcessLauncher`), Ray actors in
placement groups (`RayLauncher`), or the caller's own factory (`FactoryLauncher`: tests put
stand-ins there). The driver asks only this interface; what a way cannot do (Ray places its
actors itself, so its node groups are labels and nothing moves between them) it says here."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from loom.core.errors import ConfigError
from loom.runtime.cluster.wpg import WorkerGroup, WorkerGroupConfig, Workers
from loom.state.sidecar import SidecarConfig, StateSidecar

__all__ = ["FactoryLauncher", "Launcher", "ProcessLauncher", "RayLauncher", "make_launcher"]

log = logging.getLogger("loom.cluster")


class Launcher(abc.ABC):
    """One way to start worker groups on the service's node groups."""

    #: whether `mirror` moves a deployment's offloaded state to another node group
    moves_state: bool = False

    def check_layout(self, dp: int) -> None:
        """Refuse a layout this way cannot start (ConfigError saying why)."""
        return None  # (nothing, unless a launcher says otherwise)

    @abc.abstractmethod
    async def launch(self, cfg: WorkerGroupConfig, group: int) -> Workers:
        """A started worker group for `cfg` on node group `group`."""

    async def mirror(self, name: str, src: int, dst: int) -> None:
        """Copy `name`'s offloaded state from node group `src` to `dst`, for ranks started
        there with `start_offloaded` (only where `moves_state`)."""
        raise NotImplementedError(f"{type(self).__name__} moves no state between node groups")

    async def unmirror(self, name: str, group: int) -> None:
        """Drop what a failed move left of `name` on node group `group`."""
        return None  # (nothing, unless a launcher says otherwise)

    def lost_nodes(self) -> dict[int, str]:
        """Node groups whose state holder died, and how (their state is gone)."""
        return {}

    async def forget_node(self, group: int) -> None:
        """Let go of node group `group`'s dead state holder; the next launch there starts a
        new one."""
        return None  # (nothing, unless a launcher says otherwise)

    async def stats(self, groups: Mapping[str, Workers]) -> dict[str, Any]:
        """What holds the deployments' state, per node group or per deployment."""
        loop = asyncio.get_running_loop()
        out = {
            dep_id: await loop.run_in_executor(None, functools.partial(wpg.state, "stats"))
            for dep_id, wpg in groups.items()
        }
        return {"deployments": out}

    async def close(self) -> None:
        """Stop what this launcher started beside the worker groups."""
        return None  # (nothing, unless a launcher says otherwise)


class ProcessLauncher(Launcher):
    """Worker processes on this machine, their state on their node group's sidecar (one per
    group, started on first use, or again after it died)."""

    moves_state = True

    def __init__(
        self,
        groups: int,
        gpus_per_group: int,
        state: SidecarConfig,
        state_dir: Path | None,
        on_node_lost: Callable[[int, list[str]], None] = lambda group, names: None,
    ) -> None:
        self.gpus_per_group, self.state, self.state_dir = gpus_per_group, state, state_dir
        self.on_node_lost = on_node_lost
        self._sidecars: list[StateSidecar | None] = [None] * groups
        self._locks = [asyncio.Lock() for _ in range(groups)]
        self._names: list[set[str]] = [set() for _ in range(groups)]  # worker groups there

    def check_layout(self, dp: int) -> None:
        if dp > self.gpus_per_group:
            raise ConfigError(
                f"dp {dp} is more ranks than a node group's {self.gpus_per_group} GPUs"
            )

    def sidecar(self, group: int) -> StateSidecar | None:
        """The group's sidecar, if one was started (alive or not)."""
        return self._sidecars[group]

    async def node(self, group: int) -> StateSidecar:
        """The group's sidecar, started on first use (or again if it died)."""
        async with self._locks[group]:
            sc = self._sidecars[group]
            if sc is not None and not sc.alive:
                names = sorted(self._names[group])
                log.error("node group %d's sidecar died; state of %s is lost", group, names)
                self.on_node_lost(group, names)
            if sc is None or not sc.alive:
                disk = "" if self.state_dir is None else str(self.state_dir / f"group{group}")
                cfg = SidecarConfig(
                    **(asdict(self.state) | {"gpus": self.gpus_per_group, "disk_dir": disk})
                )
                sc = await asyncio.get_running_loop().run_in_executor(
                    None, lambda: StateSidecar(cfg).start()
                )
                self._sidecars[group] = sc
            return sc

    async def launch(self, cfg: WorkerGroupConfig, group: int) -> Workers:
        sidecar = await self.node(group)
        wpg = WorkerGroup(replace(cfg, state_address=sidecar.address), state_token=sidecar.token)
        await asyncio.get_running_loop().run_in_executor(None, wpg.start)
        self._names[group].add(cfg.name)
        return wpg

    async def mirror(self, name: str, src: int, dst: int) -> None:
        here, there = await self.node(src), await self.node(dst)

        def send() -> None:
            with here.client(timeout_s=600) as c:
                c.call("mirror", dep=name, to=there.address, token=there.token.hex())

        await asyncio.get_running_loop().run_in_executor(None, send)
        self._names[src].discard(name)
        self._names[dst].add(name)

    async def unmirror(self, name: str, group: int) -> None:
        sc = self._sidecars[group]
        if sc is None or not sc.alive:
            return

        def drop() -> None:
            with contextlib.suppress(Exception), sc.client(timeout_s=60) as c:
                c.call("drop", dep=name)

        await asyncio.get_running_loop().run_in_executor(None, drop)

    def lost_nodes(self) -> dict[int, str]:
        return {
            g: f"node group {g}'s StateManager sidecar (pid {sc.pid}) exited ({sc.exit_code})"
            for g, sc in enumerate(self._sidecars)
            if sc is not None and not sc.alive
        }

    async def forget_node(self, group: int) -> None:
        async with self._locks[group]:
            sc = self._sidecars[group]
            if sc is None or sc.alive:
                return
            self._sidecars[group] = None
            self._names[group].clear()
        await asyncio.get_running_loop().run_in_executor(None, sc.close)

    async def stats(self, groups: Mapping[str, Workers]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        out: dict[str, Any] = {}
        for g, sc in enumerate(self._sidecars):
            if sc is not None and sc.alive:
                with sc.client(timeout_s=60) as c:
                    out[str(g)] = await loop.run_in_executor(None, c.call, "stats")
        return {"groups": out}

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for sc in self._sidecars:
            if sc is not None:
                await loop.run_in_executor(None, sc.close)


class RayLauncher(Launcher):
    """Ray actors in a placement group per deployment (each Ray node's sidecar holds its
    state); a node group is a label: the actors stay where Ray placed them."""

    def __init__(self, gpus_per_rank: float = 0.0) -> None:
        self.gpus_per_rank = gpus_per_rank

    async def launch(self, cfg: WorkerGroupConfig, group: int) -> Workers:
        from loom.runtime.cluster.ray_wpg import RayWorkerGroup

        wpg = RayWorkerGroup(cfg, gpus_per_rank=self.gpus_per_rank)
        await asyncio.get_running_loop().run_in_executor(None, wpg.start)
        return wpg


class FactoryLauncher(Launcher):
    """The caller's factory of worker groups (a test's stand-ins); started here."""

    def __init__(self, factory: Callable[[WorkerGroupConfig], Workers]) -> None:
        self.factory = factory

    async def launch(self, cfg: WorkerGroupConfig, group: int) -> Workers:
        wpg = self.factory(cfg)
        await asyncio.get_running_loop().run_in_executor(None, wpg.start)
        return wpg


def make_launcher(
    kind: str,
    *,
    groups: int,
    gpus_per_group: int,
    gpus_per_rank: float,
    state: SidecarConfig,
    state_dir: Path | None,
    on_node_lost: Callable[[int, list[str]], None],
) -> Launcher:
    """The launcher a service's setting names: "process" or "ray"."""
    if kind == "process":
        return ProcessLauncher(groups, gpus_per_group, state, state_dir, on_node_lost)
    if kind == "ray":
        return RayLauncher(gpus_per_rank)
    raise ConfigError(f"launcher must be process or ray, got {kind!r}")
