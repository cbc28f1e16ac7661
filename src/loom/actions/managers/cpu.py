"""CPU manager via allocate-on-execution (§5.2).

Cores are pooled per node and given to one action at a time as an exclusive core set, taken
from a single NUMA domain when one fits. A trajectory's first action pins it to a node chosen
by memory load balance (the node must hold the trajectory's memory for its whole life, as the
container's memory is preserved between actions); later actions run there. Each node is its
own scheduling domain, so the scheduler makes one pass per node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from loom.actions.managers.base import Grant, Ledger, ResourceManager
from loom.actions.tangram.arrange import Arrangement, PrefixArrangements, dp_arrange
from loom.core.actions import ActionSpec
from loom.core.errors import ConfigError
from loom.core.resources import ResourceKind

__all__ = ["CpuManager", "CpuNode"]

CPU = ResourceKind.CPU.value
MEM = ResourceKind.MEMORY_GB.value


@dataclass(frozen=True, kw_only=True)
class CpuNode:
    """A CPU node: core ids grouped by NUMA domain, and host memory for environments."""

    name: str
    numa: tuple[tuple[int, ...], ...]
    memory_gb: float

    def __post_init__(self) -> None:
        cores = [c for dom in self.numa for c in dom]
        if not cores:
            raise ConfigError(f"CPU node {self.name!r} needs at least one core")
        if len(set(cores)) != len(cores):
            raise ConfigError(f"CPU node {self.name!r} lists a core twice")
        if not self.memory_gb > 0:
            raise ConfigError(f"CPU node {self.name!r}: memory_gb must be > 0")

    @classmethod
    def uniform(cls, name: str, cores: int, numa_domains: int = 1, memory_gb: float = 256.0):
        """`cores` cores numbered 0.. split evenly over `numa_domains` domains."""
        if cores < 1 or numa_domains < 1 or cores % numa_domains:
            raise ConfigError(f"{cores} cores cannot split evenly over {numa_domains} domains")
        per = cores // numa_domains
        numa = tuple(tuple(range(d * per, (d + 1) * per)) for d in range(numa_domains))
        return cls(name=name, numa=numa, memory_gb=memory_gb)

    @property
    def num_cores(self) -> int:
        return sum(len(d) for d in self.numa)


def _mem(action: ActionSpec) -> float:
    return float(action.demand[MEM].minimum) if MEM in action.demand else 0.0


class CpuManager(ResourceManager):
    name = "cpu"
    unit_key = CPU

    def __init__(self, nodes: Sequence[CpuNode], action_overhead_s: float = 0.0) -> None:
        """`action_overhead_s`: what AOE pays per action before it runs (updating the
        container's cgroup, `docker exec`), charged to every grant."""
        if not nodes:
            raise ConfigError("CPU manager needs at least one node")
        if not action_overhead_s >= 0:
            raise ConfigError(
                f"CPU manager: action_overhead_s must be >= 0, got {action_overhead_s}"
            )
        self.action_overhead_s = float(action_overhead_s)
        self.nodes = {n.name: n for n in nodes}
        if len(self.nodes) != len(nodes):
            raise ConfigError("CPU manager: duplicate node names")
        # Free cores per node per NUMA domain (sorted sets of ids, kept as sorted lists).
        self._free: dict[str, list[list[int]]] = {
            n.name: [sorted(d) for d in n.numa] for n in nodes
        }
        self._free_mem = {n.name: n.memory_gb for n in nodes}
        self._pin: dict[str, str] = {}  # trajectory -> node
        self._traj_mem: dict[str, float] = {}

    # -- views -----------------------------------------------------------------------------
    def free_cores(self, node: str) -> int:
        return sum(len(d) for d in self._free[node])

    def free_memory_gb(self, node: str) -> float:
        return self._free_mem[node]

    def node_of(self, trajectory_id: str) -> str | None:
        return self._pin.get(trajectory_id)

    # -- ResourceManager -------------------------------------------------------------------
    def owns(self, key: str) -> bool:
        return key in (CPU, MEM)

    def validate(self, action: ActionSpec) -> None:
        need = action.demand[CPU].minimum if CPU in action.demand else 0
        mem = _mem(action)
        if not any(n.num_cores >= need and n.memory_gb >= mem for n in self.nodes.values()):
            raise ConfigError(
                f"action {action.action_id!r} needs {need} cores and {mem} GB, "
                "more than any CPU node has"
            )

    def pinned_domain(self, action: ActionSpec) -> str | None:
        return self._pin.get(action.trajectory_id)

    def ledger(self, now: float = 0.0) -> Ledger:
        return _CpuLedger(self)

    def allocate(self, action: ActionSpec, units: int, domain: str, now: float) -> Grant:
        self._ensure_pin(action, domain)
        cores = self._pick_cores(domain, units)
        return Grant(
            action_id=action.action_id,
            manager=self.name,
            domain=domain,
            units=units,
            cores=cores,
            memory_gb=self._traj_mem[action.trajectory_id],
            overhead_s=self.action_overhead_s,
        )

    def release(self, action: ActionSpec, grant: Grant, now: float) -> None:
        node = self.nodes[grant.domain]
        for core in grant.cores:
            for d, dom in enumerate(node.numa):
                if core in dom:
                    assert core not in self._free[grant.domain][d], f"core {core} freed twice"
                    self._free[grant.domain][d].append(core)
                    self._free[grant.domain][d].sort()
                    break

    def end_trajectory(self, trajectory_id: str) -> None:
        node = self._pin.pop(trajectory_id, None)
        if node is not None:
            self._free_mem[node] += self._traj_mem.pop(trajectory_id)

    # -- internals -------------------------------------------------------------------------
    def _ensure_pin(self, action: ActionSpec, node: str) -> None:
        tid = action.trajectory_id
        mem = _mem(action)
        pinned = self._pin.get(tid)
        if pinned is None:
            assert self._free_mem[node] >= mem - 1e-9, f"node {node} lacks {mem} GB"
            self._pin[tid] = node
            self._traj_mem[tid] = mem
            self._free_mem[node] -= mem
            return
        assert pinned == node, f"trajectory {tid} is pinned to {pinned}, not {node}"
        extra = mem - self._traj_mem[tid]
        if extra > 0:  # a later action needs more memory than the trajectory reserved
            assert self._free_mem[node] >= extra - 1e-9, f"node {node} lacks {extra} GB"
            self._traj_mem[tid] = mem
            self._free_mem[node] -= extra

    def _pick_cores(self, node: str, units: int) -> tuple[int, ...]:
        doms = self._free[node]
        best: list[int] | None = None
        room = 0
        for dom in doms:  # NUMA-local: the fullest domain that still fits (the first such)
            n = len(dom)
            if units <= n and (best is None or n < room):
                best, room = dom, n
        if best is not None:
            local = tuple(best[:units])
            del best[:units]
            return local
        taken: list[int] = []
        for d in sorted(range(len(doms)), key=lambda i: (-len(doms[i]), i)):
            k = min(units - len(taken), len(doms[d]))
            taken += doms[d][:k]
            del doms[d][:k]
            if len(taken) == units:
                break
        assert len(taken) == units, f"node {node} has fewer than {units} free cores"
        return tuple(sorted(taken))


class _CpuLedger(Ledger):
    def __init__(self, mgr: CpuManager) -> None:
        self._mgr = mgr
        self._cores = {n: mgr.free_cores(n) for n in mgr.nodes}
        self._mem = dict(mgr._free_mem)
        self._pin: dict[str, str] = {}
        self._traj_mem: dict[str, float] = {}
        self._single = next(iter(mgr.nodes)) if len(mgr.nodes) == 1 else None

    def take(self, action: ActionSpec, units: int | None, domain: str | None = None) -> str | None:
        tid = action.trajectory_id
        u = units if units is not None else action.demand[CPU].minimum
        mem = _mem(action)
        cores, free_mem = self._cores, self._mem
        node = self._mgr._pin.get(tid) or self._pin.get(tid)
        if node is None:
            target = domain if domain is not None else self._single
            if target is not None:  # the domain asked for, or the only node
                if cores[target] < u or free_mem[target] < mem:
                    return None
                node = target
            else:
                node = self._roomiest(u, mem)
                if node is None:
                    return None
            self._pin[tid] = node
        elif domain is not None and node != domain:
            return None
        held = self._mgr._traj_mem.get(tid)
        if held is None:
            held = self._traj_mem.get(tid, 0.0)
        extra = mem - held if mem > held else 0.0
        if cores[node] < u or free_mem[node] < extra:
            return None
        cores[node] -= u
        free_mem[node] -= extra
        prior = self._traj_mem.get(tid, 0.0)
        self._traj_mem[tid] = mem if mem > prior else prior
        return node

    def _roomiest(self, units: int, mem: float) -> str | None:
        """Memory load balance: of the nodes with `units` cores and `mem` GB free, the one
        with the most free memory by fraction (then the greatest name)."""
        best, score = None, (0.0, "")
        for n, spec in self._mgr.nodes.items():
            if self._cores[n] >= units and self._mem[n] >= mem:
                s = (self._mem[n] / spec.memory_gb, n)
                if best is None or s > score:
                    best, score = n, s
        return best

    def give(self, action: ActionSpec, domain: str, units: int, *, full: bool = False) -> None:
        self._cores[domain] += units
        tid = action.trajectory_id
        if full and tid in self._pin and tid not in self._mgr._pin:
            # The pin and its memory were only tentative: undo both.
            del self._pin[tid]
            self._mem[domain] += self._traj_mem.pop(tid, 0.0)

    def free_units(self, domain: str) -> int:
        return self._cores[domain]

    def arrange(self, domain: str, durations: Sequence[Mapping[int, float]]) -> Arrangement | None:
        return dp_arrange(durations, self._cores[domain])

    def prefixes(
        self, domain: str, durations: Sequence[Mapping[int, float]]
    ) -> Callable[[int], Arrangement | None]:
        return PrefixArrangements(durations, self._cores[domain]).arrangement
