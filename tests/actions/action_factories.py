"""Builders of managers and actions shared by the action-level tests."""

from __future__ import annotations

from collections.abc import Callable

from loom.actions.managers.basic import ApiLimit, BasicManager
from loom.actions.managers.cpu import CpuManager, CpuNode
from loom.actions.managers.gpu import GpuManager, GpuNode, ServiceSpec
from loom.core.actions import ActionKind, ActionSpec
from loom.core.resources import DiscreteSet, RangeSet, api_quota


def amdahl(p: float) -> Callable[[int], float]:
    """E(m) of a job whose fraction `p` parallelises perfectly."""
    return lambda m: 1.0 / (m * ((1 - p) + p / m))


def cpu_action(
    i: int,
    *,
    traj: str | None = None,
    lo: int = 1,
    hi: int = 1,
    t: float = 10.0,
    p: float | None = 0.95,
    mem: int = 0,
) -> ActionSpec:
    demand = {"cpu": RangeSet(lo, hi)}
    if mem:
        demand["memory_gb"] = RangeSet(mem, mem)
    return ActionSpec(
        action_id=f"c{i}",
        trajectory_id=traj or f"t{i}",
        kind=ActionKind.CPU_TOOL,
        demand=demand,
        key_resource="cpu",
        t_ori_s=t,
        elasticity=None if p is None else amdahl(p),
    )


def gpu_action(i: int, service: str, *, dops=(1, 2, 4, 8), t: float = 8.0) -> ActionSpec:
    return ActionSpec(
        action_id=f"g{i}",
        trajectory_id=f"t{i}",
        kind=ActionKind.GPU_SERVICE,
        demand={"gpu": DiscreteSet(tuple(dops))},
        key_resource="gpu",
        t_ori_s=t,
        elasticity=amdahl(0.9),
        service=service,
    )


def api_action(i: int, name: str = "search") -> ActionSpec:
    return ActionSpec(
        action_id=f"a{i}",
        trajectory_id=f"t{i}",
        kind=ActionKind.API,
        demand={api_quota(name): RangeSet(1, 1)},
        t_ori_s=1.0,
    )


def cpu_manager(cores: int = 16, nodes: int = 1, numa: int = 2, mem: float = 64.0) -> CpuManager:
    return CpuManager([CpuNode.uniform(f"n{k}", cores, numa, mem) for k in range(nodes)])


def gpu_manager(nodes: int = 1, memory_gb: float = 80.0) -> GpuManager:
    return GpuManager(
        [GpuNode(name=f"g{k}", memory_gb=memory_gb) for k in range(nodes)],
        [
            ServiceSpec(name="judge", weights_gb=60.0),
            ServiceSpec(name="teacher", weights_gb=120.0, dops=(2, 4, 8)),
        ],
    )


def basic_manager(concurrency: int = 2, quota: int | None = None) -> BasicManager:
    return BasicManager(
        [ApiLimit(key=api_quota("search"), concurrency=concurrency, quota=quota, period_s=10.0)]
    )
