"""The engines the jobs' rollouts share (RollMux's rollout multiplexing): they serve one job's
weights at a time and the jobs take them in turn, first come first served. Taking them loads
the job's weights at the version its step needs where they hold anything else — a `switch`
when another job's weights are loaded (each job's copy stays warm in the engines' host
memory), a `sync` when an older version of its own is — and tells the router.

The router numbers the weights it has seen loaded, one number per load (its versions only
grow); each number stands for a (job, version), and each response carries the number of the
weights that produced it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from loom.runtime.engine.weight_sync import EngineRef, EngineSync, sync_engines

__all__ = ["Held", "SharedEngines"]


@dataclass(frozen=True, kw_only=True)
class Held:
    router_version: int  # what the router calls the weights loaded
    waited_s: float  # until the engines were this job's
    kind: str | None  # "switch", "sync", or None (they held these weights already)
    load_s: float
    engines: tuple[EngineSync, ...] = ()

    @property
    def pulled_bytes(self) -> int:
        return sum(e.pulled_bytes for e in self.engines)


@dataclass
class SharedEngines:
    engines: Sequence[EngineRef]
    router: str
    token: str | None = None
    active: tuple[str, int] | None = None  # (job, version) loaded now
    router_version: int = -1
    loads: dict[int, tuple[str, int]] = field(default_factory=dict)  # router version -> weights
    switches: int = 0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @contextlib.asynccontextmanager
    async def serving(self, job: str, relay: str, version: int) -> AsyncIterator[Held]:
        """The engines, with `job`'s weights at `version` loaded, until the block ends."""
        t0 = time.perf_counter()
        async with self._lock:
            waited = time.perf_counter() - t0
            kind: str | None = None
            done: list[EngineSync] = []
            if self.active != (job, version):
                kind = "switch" if self.active is not None and self.active[0] != job else "sync"
                self.router_version += 1
                t1 = time.perf_counter()
                done = await asyncio.to_thread(
                    sync_engines,
                    self.engines,
                    relay=relay,
                    job=job,
                    version=version,
                    router=self.router,
                    router_version=self.router_version,
                    token=self.token,
                )
                self.switches += kind == "switch"
                self.active = (job, version)
                self.loads[self.router_version] = self.active
                load_s = time.perf_counter() - t1
            else:
                load_s = 0.0
            yield Held(
                router_version=self.router_version,
                waited_s=waited,
                kind=kind,
                load_s=load_s,
                engines=tuple(done),
            )
