"""The MOPD baseline of §6.1: each reward service deployed on its own GPUs with SGLang —
`replicas` instances of tensor-parallel degree `tp`, always resident (never restored), each
serving its service's queue first come, first served.

NOTE: a replica runs one action at a time, as Tangram's GPU manager does (§5.3); log-prob and
judge requests are prefill-bound, so batching them buys little throughput.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loom.actions.baselines.common import manager_of
from loom.actions.managers.base import Grant, ResourceManager
from loom.actions.managers.gpu import GpuManager, GpuNode, ServiceSpec
from loom.actions.policy import ACTION_POLICIES, ActionPolicyKind, Start
from loom.core.actions import ActionKind, ActionSpec
from loom.core.errors import ConfigError

__all__ = ["Deployment", "StaticServing", "place_replicas"]


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """`replicas` instances of `service`, each on `tp` GPUs of one node."""

    service: str
    replicas: int = 1
    tp: int = 4

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.tp < 1 or self.tp & (self.tp - 1):
            raise ConfigError(
                f"deployment of {self.service!r}: replicas >= 1 and a power-of-two tp needed"
            )


@dataclass
class _Replica:
    service: str
    node: str
    start: int
    tp: int
    busy: str | None = None  # the action it runs

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(range(self.start, self.start + self.tp))


def place_replicas(
    nodes: Sequence[GpuNode],
    services: Mapping[str, ServiceSpec],
    deployments: Sequence[Deployment],
) -> list[tuple[str, str, int, int]]:
    """(service, node, first GPU, tp) of every replica: largest degree first, each at the
    lowest aligned free offset of the first node that has one. Raises when they do not fit."""
    busy: dict[str, set[int]] = {n.name: set() for n in nodes}
    out = []
    order = sorted(deployments, key=lambda d: -d.tp)
    for d in order:
        svc = services.get(d.service)
        if svc is None:
            raise ConfigError(f"deployment names unknown service {d.service!r}")
        for _ in range(d.replicas):
            spot = next(
                (
                    (n.name, off)
                    for n in nodes
                    if d.tp <= n.gpus and svc.memory_per_gpu(d.tp) <= n.memory_gb
                    for off in range(0, n.gpus, d.tp)
                    if busy[n.name].isdisjoint(range(off, off + d.tp))
                ),
                None,
            )
            if spot is None:
                total = sum(x.replicas * x.tp for x in deployments)
                raise ConfigError(
                    f"no room for a TP{d.tp} replica of {d.service!r}: the deployments need "
                    f"{total} GPUs, the nodes have {sum(n.gpus for n in nodes)}"
                )
            busy[spot[0]].update(range(spot[1], spot[1] + d.tp))
            out.append((d.service, spot[0], spot[1], d.tp))
    return out


class StaticServing:
    """Dedicated, always-resident replicas per service; FCFS per service."""

    def __init__(
        self,
        nodes: Sequence[GpuNode],
        services: Mapping[str, ServiceSpec],
        deployments: Sequence[Deployment],
    ) -> None:
        self._replicas = [
            _Replica(svc, node, start, tp)
            for svc, node, start, tp in place_replicas(nodes, services, deployments)
        ]
        self._queues: dict[str, deque[ActionSpec]] = {d.service: deque() for d in deployments}
        self._order: dict[str, int] = {}
        self._running: dict[str, _Replica] = {}
        self._seq = 0

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def gpus(self) -> int:
        return sum(r.tp for r in self._replicas)

    def submit(self, action: ActionSpec, now: float) -> None:
        if action.kind != ActionKind.GPU_SERVICE or action.service not in self._queues:
            raise ConfigError(
                f"action {action.action_id!r}: service {action.service!r} is not deployed "
                f"(deployed: {', '.join(sorted(self._queues))})"
            )
        if action.action_id in self._order or action.action_id in self._running:
            raise ConfigError(f"action id {action.action_id!r} is already queued or running")
        self._queues[action.service].append(action)
        self._order[action.action_id] = self._seq
        self._seq += 1

    def schedule(self, now: float) -> list[Start]:
        starts: list[tuple[int, Start]] = []
        for r in self._replicas:
            q = self._queues[r.service]
            if r.busy is not None or not q:
                continue
            a = q.popleft()
            r.busy = a.action_id
            self._running[a.action_id] = r
            grant = Grant(
                action_id=a.action_id, manager="sglang", domain=r.node, units=r.tp, gpus=r.gpus
            )
            start = Start(
                action=a,
                units=r.tp,
                domain=r.node,
                grants=(grant,),
                overhead_s=0.0,
                expected_s=a.duration_s(r.tp),
            )
            starts.append((self._order.pop(a.action_id), start))
        return [s for _, s in sorted(starts, key=lambda x: x[0])]

    def finish(self, action_id: str, now: float) -> None:
        r = self._running.pop(action_id, None)
        if r is None:
            raise ConfigError(f"action {action_id!r} is not running")
        r.busy = None

    def cancel(self, action_id: str) -> bool:
        for q in self._queues.values():
            for a in q:
                if a.action_id == action_id:
                    q.remove(a)
                    del self._order[action_id]
                    return True
        return False

    def end_trajectory(self, trajectory_id: str, now: float) -> None:
        return None

    def next_wakeup(self, now: float) -> float | None:
        return None


@ACTION_POLICIES.register(ActionPolicyKind.SGLANG_STATIC)
def sglang_static(
    managers: Sequence[ResourceManager], deployments: Sequence[Deployment] | None = None
) -> StaticServing:
    """Default deployment: every service on four GPUs with TP4 (§6.1)."""
    gm = manager_of(managers, GpuManager, "sglang_static")
    deps = deployments or [Deployment(service=s, replicas=1, tp=4) for s in gm.services]
    return StaticServing(gm.nodes, gm.services, deps)
