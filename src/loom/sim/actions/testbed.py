"""The external resources an action-level run owns: CPU nodes, GPU nodes with the services
they may host, and API providers with their limits. Every policy of a comparison gets fresh
managers over the same testbed, and the simulator enforces its physics (processor sharing on
CPU nodes, provider limits on APIs) whatever the policy decides."""

from __future__ import annotations

from dataclasses import dataclass, field

from loom.actions.managers.base import ResourceManager
from loom.actions.managers.basic import ApiLimit, BasicManager
from loom.actions.managers.cpu import CpuManager, CpuNode
from loom.actions.managers.gpu import GpuManager, GpuNode, ServiceSpec
from loom.core.errors import ConfigError
from loom.core.resources import api_quota

__all__ = ["ApiProvider", "Testbed"]


@dataclass(frozen=True, kw_only=True)
class ApiProvider:
    """An external API as its provider enforces it: at most `concurrency` calls in flight and
    at most `quota` accepted calls per aligned window of `period_s`; a call over either limit
    is rejected after `error_latency_s`."""

    name: str
    concurrency: int
    quota: int | None = None
    period_s: float = 60.0
    error_latency_s: float = field(
        default=0.5,
        metadata={"help": "assumed: time until a rejected call returns its error (a 429)"},
    )

    def __post_init__(self) -> None:
        self.limit()  # validates concurrency, quota and period
        if not self.error_latency_s >= 0:
            raise ConfigError(f"API {self.name!r}: error_latency_s must be >= 0")

    @property
    def key(self) -> str:
        return api_quota(self.name)

    def limit(self) -> ApiLimit:
        """The same limits, as Tangram's basic manager is configured to respect them."""
        return ApiLimit(
            key=self.key, concurrency=self.concurrency, quota=self.quota, period_s=self.period_s
        )


@dataclass(frozen=True, kw_only=True)
class Testbed:
    """The nodes, services and APIs of one run."""

    __test__ = False  # NOTE: not a pytest test class, despite its name
    cpu_nodes: tuple[CpuNode, ...] = ()
    gpu_nodes: tuple[GpuNode, ...] = ()
    services: tuple[ServiceSpec, ...] = ()
    apis: tuple[ApiProvider, ...] = ()
    cpu_action_overhead_s: float = field(
        default=0.0, metadata={"help": "the CPU manager's overhead per action (AOE)"}
    )

    def __post_init__(self) -> None:
        for kind, names in (
            ("CPU node", [n.name for n in self.cpu_nodes]),
            ("GPU node", [n.name for n in self.gpu_nodes]),
            ("service", [s.name for s in self.services]),
            ("API", [a.name for a in self.apis]),
        ):
            if len(set(names)) != len(names):
                raise ConfigError(f"testbed: duplicate {kind} names in {names}")
        if self.services and not self.gpu_nodes:
            raise ConfigError("testbed: services need GPU nodes")

    @property
    def cpu_cores(self) -> int:
        return sum(n.num_cores for n in self.cpu_nodes)

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.gpu_nodes)

    def provider(self, key: str) -> ApiProvider:
        for a in self.apis:
            if a.key == key:
                return a
        raise ConfigError(f"testbed has no API provider for {key!r}")

    def managers(self) -> list[ResourceManager]:
        """Fresh resource managers over every resource of the testbed."""
        out: list[ResourceManager] = []
        if self.cpu_nodes:
            out.append(CpuManager(self.cpu_nodes, self.cpu_action_overhead_s))
        if self.gpu_nodes:
            out.append(GpuManager(self.gpu_nodes, self.services))
        if self.apis:
            out.append(BasicManager([a.limit() for a in self.apis]))
        return out
