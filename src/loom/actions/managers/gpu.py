"""GPU manager via evict-on-execution (§5.3).

Every service is backed up in host memory; a GPU action gets an exclusive, aligned
power-of-two chunk of one node's GPUs (buddy split of the smallest adequate free chunk,
preferring one that already caches the service at that degree), and the service is restored
there unless cached, evicting idle cached services least-recently-used first until it fits.
Each degree of parallelism of a service is a distinct cached instance. Nothing is written back
on eviction: the host copy is invariant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from loom.actions.managers.base import Grant, Ledger, ResourceManager
from loom.actions.tangram.arrange import Arrangement, dp_arrange_chunks
from loom.core.actions import ActionSpec
from loom.core.errors import ConfigError
from loom.core.resources import ResourceKind

__all__ = ["GpuManager", "GpuNode", "ServiceSpec"]

GPU = ResourceKind.GPU.value
GPU_MEM = ResourceKind.GPU_MEMORY_GB.value


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@dataclass(frozen=True, kw_only=True)
class GpuNode:
    """A GPU node: `gpus` devices (a power of two), memory per device, host-to-device
    bandwidth for restoring services, and a fixed per-restore cost (process and graph setup)."""

    name: str
    gpus: int = 8
    memory_gb: float = 80.0
    h2d_gbs: float = 25.0
    restore_fixed_s: float = 0.5

    def __post_init__(self) -> None:
        if not _pow2(self.gpus):
            raise ConfigError(f"GPU node {self.name!r}: gpus must be a power of two")
        if not (self.memory_gb > 0 and self.h2d_gbs > 0 and self.restore_fixed_s >= 0):
            raise ConfigError(f"GPU node {self.name!r}: memory and bandwidth must be > 0")


@dataclass(frozen=True, kw_only=True)
class ServiceSpec:
    """A model service: weights (GB, sharded over the degree) plus per-GPU working memory."""

    name: str
    weights_gb: float
    working_gb: float = 4.0
    dops: tuple[int, ...] = (1, 2, 4, 8)

    def __post_init__(self) -> None:
        if not self.weights_gb >= 0 or not self.working_gb >= 0:
            raise ConfigError(f"service {self.name!r}: memory must be >= 0")
        if not self.dops or not all(_pow2(d) for d in self.dops):
            raise ConfigError(f"service {self.name!r}: degrees must be powers of two")

    def memory_per_gpu(self, dop: int) -> float:
        return self.weights_gb / dop + self.working_gb


@dataclass
class _Instance:
    service: str
    dop: int
    start: int
    last_used: float

    def covers(self, gpu: int) -> bool:
        return self.start <= gpu < self.start + self.dop


@dataclass
class _NodeState:
    spec: GpuNode
    free: list[tuple[int, int]]  # free chunks as (start, size), kept sorted
    cached: list[_Instance] = field(default_factory=list)

    def used_mem(self, gpu: int, services: Mapping[str, ServiceSpec]) -> float:
        return sum(services[i.service].memory_per_gpu(i.dop) for i in self.cached if i.covers(gpu))


def _take_chunk(
    free: list[tuple[int, int]], size: int, prefer: Sequence[int] = ()
) -> tuple[int, int] | None:
    """Buddy allocation: the smallest free chunk of at least `size`, split down to `size`.
    Among equal candidates, an aligned offset in `prefer` wins, else the lowest start."""
    fits = [c for c in free if c[1] >= size]
    if not fits:
        return None
    best = min(c[1] for c in fits)
    options = [
        (start + off, c)
        for c in fits
        if c[1] == best
        for start in (c[0],)
        for off in range(0, best, size)
    ]
    chosen = next(((o, c) for o, c in options if o in prefer), options[0])
    offset, (start, csize) = chosen
    free.remove((start, csize))
    while csize > size:  # split, keeping the half that holds `offset`
        csize //= 2
        if offset >= start + csize:
            free.append((start, csize))
            start += csize
        else:
            free.append((start + csize, csize))
    free.sort()
    return offset, size


def _give_chunk(free: list[tuple[int, int]], start: int, size: int, total: int) -> None:
    """Return a chunk and merge it with free buddies."""
    assert all(not (s < start + size and start < s + z) for s, z in free), "chunk freed twice"
    while size < total:
        buddy = start ^ size
        if (buddy, size) not in free:
            break
        free.remove((buddy, size))
        start = min(start, buddy)
        size *= 2
    free.append((start, size))
    free.sort()


class GpuManager(ResourceManager):
    name = "gpu"
    unit_key = GPU

    def __init__(self, nodes: Sequence[GpuNode], services: Sequence[ServiceSpec]) -> None:
        if not nodes:
            raise ConfigError("GPU manager needs at least one node")
        self.services = {s.name: s for s in services}
        if len(self.services) != len(services):
            raise ConfigError("GPU manager: duplicate service names")
        self._nodes = {n.name: _NodeState(n, [(0, n.gpus)]) for n in nodes}
        if len(self._nodes) != len(nodes):
            raise ConfigError("GPU manager: duplicate node names")
        self.restores = 0
        self.hits = 0

    # -- views -----------------------------------------------------------------------------
    @property
    def nodes(self) -> list[GpuNode]:
        return [s.spec for s in self._nodes.values()]

    def free_gpus(self, node: str) -> int:
        return sum(z for _, z in self._nodes[node].free)

    def cached(self, node: str) -> list[tuple[str, int, int]]:
        """(service, degree, start GPU) of every instance resident on `node`."""
        return [(i.service, i.dop, i.start) for i in self._nodes[node].cached]

    def memory_used_gb(self, node: str, gpu: int) -> float:
        return self._nodes[node].used_mem(gpu, self.services)

    # -- ResourceManager -------------------------------------------------------------------
    def owns(self, key: str) -> bool:
        return key in (GPU, GPU_MEM)

    def options(self, action: ActionSpec) -> tuple[int, ...]:
        svc = self.services.get(action.service or "")
        if svc is None:
            return ()
        asked = action.demand[GPU].values() if GPU in action.demand else (1,)
        biggest = max(s.spec.gpus for s in self._nodes.values())
        mem = max(s.spec.memory_gb for s in self._nodes.values())
        return tuple(
            d
            for d in sorted(asked)
            if d in svc.dops and d <= biggest and svc.memory_per_gpu(d) <= mem
        )

    def validate(self, action: ActionSpec) -> None:
        if action.service not in self.services:
            known = ", ".join(sorted(self.services)) or "none"
            raise ConfigError(f"unknown service {action.service!r} (known: {known})")
        if not self.options(action):
            raise ConfigError(
                f"action {action.action_id!r}: no degree in its GPU demand fits service "
                f"{action.service!r} on any node"
            )

    def pinned_domain(self, action: ActionSpec) -> str | None:
        return None

    def ledger(self, now: float = 0.0) -> Ledger:
        return _GpuLedger(self)

    def allocate(self, action: ActionSpec, units: int, domain: str, now: float) -> Grant:
        node = self._nodes[domain]
        svc = self.services[action.service or ""]
        prefer = [i.start for i in node.cached if i.service == svc.name and i.dop == units]
        got = _take_chunk(node.free, units, prefer)
        assert got is not None, f"node {domain} has no free chunk of {units}"
        start, size = got
        overhead = self._make_resident(node, svc, start, size, now)
        return Grant(
            action_id=action.action_id,
            manager=self.name,
            domain=domain,
            units=size,
            gpus=tuple(range(start, start + size)),
            overhead_s=overhead,
        )

    def release(self, action: ActionSpec, grant: Grant, now: float) -> None:
        node = self._nodes[grant.domain]
        _give_chunk(node.free, grant.gpus[0], grant.units, node.spec.gpus)

    # -- internals -------------------------------------------------------------------------
    def _make_resident(
        self, node: _NodeState, svc: ServiceSpec, start: int, size: int, now: float
    ) -> float:
        for inst in node.cached:
            if inst.service == svc.name and inst.dop == size and inst.start == start:
                inst.last_used = now
                self.hits += 1
                return 0.0
        need = svc.memory_per_gpu(size)
        gpus = range(start, start + size)

        def short() -> bool:
            cap = node.spec.memory_gb
            return any(node.used_mem(g, self.services) + need > cap + 1e-9 for g in gpus)

        # Every instance overlapping a free chunk is idle (a running one holds its whole
        # aligned chunk), so any of them may go; least recently used first.
        victims = sorted(
            (i for i in node.cached if any(i.covers(g) for g in gpus)),
            key=lambda i: (i.last_used, i.start),
        )
        for v in victims:
            if not short():
                break
            node.cached.remove(v)
        assert not short(), f"service {svc.name} does not fit {size} GPUs of {node.spec.name}"
        node.cached.append(_Instance(svc.name, size, start, now))
        self.restores += 1
        shard_gb = svc.weights_gb / size
        return node.spec.restore_fixed_s + shard_gb / node.spec.h2d_gbs


class _GpuLedger(Ledger):
    def __init__(self, mgr: GpuManager) -> None:
        self._mgr = mgr
        self._free = {n: list(s.free) for n, s in mgr._nodes.items()}
        self._taken: dict[str, list[tuple[int, int]]] = {}

    def _score(self, action: ActionSpec, node: str, size: int) -> tuple[bool, int, str]:
        state = self._mgr._nodes[node]
        cached = any(
            i.service == action.service
            and i.dop == size
            and any(s <= i.start < s + z for s, z in self._free[node])
            for i in state.cached
        )
        return (cached, sum(z for _, z in self._free[node]), node)

    def take(self, action: ActionSpec, units: int | None, domain: str | None = None) -> str | None:
        opts = self._mgr.options(action)
        size = units if units is not None else (opts[0] if opts else 0)
        if size < 1:
            return None
        pool = [domain] if domain is not None else list(self._free)
        nodes = [n for n in pool if any(z >= size for _, z in self._free[n])]
        if not nodes:
            return None
        node = max(nodes, key=lambda n: self._score(action, n, size))
        got = _take_chunk(self._free[node], size)
        assert got is not None
        self._taken.setdefault(action.action_id, []).append(got)
        return node

    def give(self, action: ActionSpec, domain: str, units: int, *, full: bool = False) -> None:
        start, size = self._taken[action.action_id].pop()
        total = self._mgr._nodes[domain].spec.gpus
        _give_chunk(self._free[domain], start, size, total)

    def free_units(self, domain: str) -> int:
        return sum(z for _, z in self._free[domain])

    def arrange(self, domain: str, durations: Sequence[Mapping[int, float]]) -> Arrangement | None:
        gpus = self._mgr._nodes[domain].spec.gpus
        return dp_arrange_chunks(durations, gpus, free=[z for _, z in self._free[domain]])
