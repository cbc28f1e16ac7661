"""Action formulation (§4.1): a client's request as the policy's `ActionSpec` — a feasible set
per resource, the key elastic resource, T_ori and E(m)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from loom.core.actions import ActionKind, ActionSpec
from loom.core.resources import DiscreteSet, FeasibleSet, RangeSet, ResourceKind, api_quota
from loom.runtime.actions.elasticity import parse_elasticity
from loom.runtime.actions.schemas import ActionRequest, CpuRange

__all__ = ["Demand", "formulate"]

CPU = ResourceKind.CPU.value
MEM = ResourceKind.MEMORY_GB.value
GPU = ResourceKind.GPU.value


@dataclass(frozen=True)
class Demand:
    """What one kind of action asks of the managers."""

    resources: dict[str, FeasibleSet]
    key: str | None
    service: str | None = None


def _cpu(req: ActionRequest, max_cores: int) -> Demand:
    lo, hi = (req.cpu.min, req.cpu.max) if isinstance(req.cpu, CpuRange) else (req.cpu, req.cpu)
    if lo <= max_cores:  # more than the machine has is pointless; too few is the manager's call
        hi = min(hi, max_cores)
    resources: dict[str, FeasibleSet] = {CPU: RangeSet(lo, hi)}
    if req.memory_gb is not None:
        # NOTE: feasible sets count whole units, so the scheduler books whole GB (rounded up);
        # the process's address-space limit uses the exact figure.
        gb = math.ceil(req.memory_gb)
        resources[MEM] = RangeSet(gb, gb)
    return Demand(resources, CPU)


def _gpu(req: ActionRequest, max_cores: int) -> Demand:
    assert req.service is not None
    return Demand({GPU: DiscreteSet(req.service.degrees())}, GPU, service=req.service.name)


def _api(req: ActionRequest, max_cores: int) -> Demand:
    assert req.api is not None
    return Demand({api_quota(req.api.name): RangeSet(1, 1)}, None)


_DEMANDS: Mapping[ActionKind, Callable[[ActionRequest, int], Demand]] = {
    ActionKind.CPU_TOOL: _cpu,
    ActionKind.GPU_SERVICE: _gpu,
    ActionKind.API: _api,
}


def formulate(
    req: ActionRequest, action_id: str, *, max_cores: int, t_ori_default: float = 0.0
) -> ActionSpec:
    """The policy's view of `req`. Without a profiled `t_ori_s` the action gets
    `t_ori_default` (a historical average): the scheduler needs durations only to estimate
    queues, and elastic units only for actions whose T_ori and E(m) are both known."""
    demand = _DEMANDS[req.kind](req, max_cores)
    units = demand.resources[demand.key].values() if demand.key else (1,)
    return ActionSpec(
        action_id=action_id,
        trajectory_id=req.trajectory_id,
        kind=req.kind,
        demand=demand.resources,
        t_ori_s=req.t_ori_s if req.t_ori_s is not None else t_ori_default,
        key_resource=demand.key,
        elasticity=parse_elasticity(req.elasticity, units),
        service=demand.service,
    )
