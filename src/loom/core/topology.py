"""Hardware vocabulary: GPU types, links, nodes, pools and the cluster they form."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from loom.core.errors import ConfigError
from loom.core.resources import ResourceKind, ResourceVector

__all__ = ["Cluster", "GpuType", "Link", "LinkKind", "Node", "Pool", "PoolRole"]


class GpuType(StrEnum):
    """GPU models with spec rows in `loom/perf/data/gpus.toml`."""

    H20 = "h20"
    H800 = "h800"
    H100 = "h100"
    H200 = "h200"
    A100 = "a100"


class LinkKind(StrEnum):
    NVLINK = "nvlink"
    PCIE = "pcie"
    INFINIBAND = "infiniband"
    ETHERNET = "ethernet"


@dataclass(frozen=True, kw_only=True)
class Link:
    """A point-to-point path: `bandwidth_gbs` in GB/s per direction, `latency_s` per message."""

    kind: LinkKind
    bandwidth_gbs: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth_gbs > 0:
            raise ConfigError(f"link bandwidth must be > 0 GB/s, got {self.bandwidth_gbs}")
        if self.latency_s < 0:
            raise ConfigError(f"link latency must be >= 0 s, got {self.latency_s}")

    def transfer_time_s(self, nbytes: float) -> float:
        """Seconds to move `nbytes` over this link, latency included."""
        if nbytes < 0:
            raise ConfigError(f"cannot transfer a negative byte count ({nbytes})")
        return self.latency_s + nbytes / (self.bandwidth_gbs * 1e9)


class PoolRole(StrEnum):
    ROLLOUT = "rollout"
    TRAINING = "training"
    SERVING = "serving"
    ACTION = "action"  # CPU sandboxes and GPU reward/teacher services


@dataclass(frozen=True, kw_only=True)
class Node:
    """One machine: GPUs of one type joined by `intra_link`, plus host cores and memory."""

    name: str
    gpu_type: GpuType | None
    num_gpus: int
    cpu_cores: int
    memory_gb: float
    numa_nodes: int = 1
    intra_link: Link | None = None

    def __post_init__(self) -> None:
        if self.num_gpus < 0 or self.cpu_cores < 0 or self.memory_gb < 0:
            raise ConfigError(f"node {self.name!r}: capacities must be >= 0")
        if self.num_gpus > 0 and self.gpu_type is None:
            raise ConfigError(f"node {self.name!r} has GPUs but no gpu_type")
        if self.numa_nodes < 1:
            raise ConfigError(f"node {self.name!r}: numa_nodes must be >= 1")

    @property
    def capacity(self) -> ResourceVector:
        return ResourceVector(
            {
                ResourceKind.GPU: self.num_gpus,
                ResourceKind.CPU: self.cpu_cores,
                ResourceKind.MEMORY_GB: self.memory_gb,
            }
        )


@dataclass(frozen=True, kw_only=True)
class Pool:
    """A set of nodes with one role; `inter_link` joins its nodes to each other."""

    name: str
    role: PoolRole
    nodes: tuple[Node, ...]
    inter_link: Link | None = None
    price_per_gpu_h: float | None = None

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ConfigError(f"pool {self.name!r} repeats a node name: {names}")

    @property
    def num_gpus(self) -> int:
        return sum(n.num_gpus for n in self.nodes)


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Pools plus the links between them (keyed by unordered pool-name pairs)."""

    pools: tuple[Pool, ...]
    links: dict[frozenset[str], Link] = field(default_factory=dict)

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(f"no pool named {name!r}; pools: {[p.name for p in self.pools]}")

    def link(self, a: str, b: str) -> Link:
        try:
            return self.links[frozenset((a, b))]
        except KeyError:
            raise KeyError(f"no link between pools {a!r} and {b!r}") from None
