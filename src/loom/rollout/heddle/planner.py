"""Worker layouts for a GPU budget: Heddle's annealed heterogeneous degrees (§6) and the
homogeneous Fix-d baselines, both scored with the same per-degree cost model.

The cost model is injected (`CostModel`): `DegreeCostModel` derives it from the roofline latency
model; the drivers bring their own beside them, `loom.sim.rollout.cost.SimulatedDegreeCost`
(groups run in the rollout simulator) and `loom.runtime.rollout.cost.ProfiledDegreeCost`
(measured engine profiles), so that this package imports neither driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Protocol

from loom.core.errors import ConfigError
from loom.core.topology import GpuType
from loom.core.trajectory import TrajectorySpec
from loom.perf.interference import interference_curve, token_time
from loom.perf.latency import LatencyModel, RooflineLatencyModel
from loom.rollout.heddle.placement import WorkerCost
from loom.rollout.heddle.resource_manager import Allocation, anneal_allocation
from loom.rollout.policy import WorkerLayout

__all__ = [
    "AnnealingPlanner",
    "CostModel",
    "DegreeCostModel",
    "FixedPlanner",
    "decode_context",
    "latency_worker_cost",
]


class CostModel(Protocol):
    """A WorkerCost per model-parallel degree, and which degrees can hold a trajectory."""

    def __call__(self, degree: int) -> WorkerCost: ...
    def feasible(self, degree: int) -> bool: ...


def latency_worker_cost(
    lat: LatencyModel, *, context_per_seq: int, max_group: int, max_running: int
) -> WorkerCost:
    """T and F of one worker from its latency model: T for one trajectory alone holding
    `context_per_seq` tokens, F up to `max_group` trajectories, of which at most as many run
    at once as fit the KV cache and `max_running`; the rest queue."""
    fit = max(1, lat.kv_capacity_tokens // context_per_seq)
    curve = interference_curve(lat, max_group, context_per_seq, max_batch=min(fit, max_running))
    return WorkerCost(token_time=token_time(lat, context_per_seq), interference=curve)


def decode_context(trajs: Sequence[TrajectorySpec]) -> int:
    """Mean context a trajectory holds while it decodes, weighted by the tokens decoded: a
    turn that starts at context c and generates n tokens contributes n·(c + (n - 1)/2)."""
    if not trajs:
        raise ConfigError("decode_context needs at least one trajectory")
    tokens = 0
    weighted = 0.0
    for spec in trajs:
        context = 0
        for turn in spec.turns:
            context += turn.input_tokens
            n = turn.output_tokens
            weighted += n * (context + (n - 1) / 2)
            tokens += n
            context += n
    return max(1, round(weighted / tokens))


@dataclass(frozen=True, kw_only=True)
class DegreeCostModel:
    """T and F for a worker of each model-parallel degree, from the latency model.

    `context_per_seq` is the typical resident context of a trajectory; F accounts for the
    batch a worker can hold (KV capacity, `max_running`) and queueing beyond it.
    """

    gpu: GpuType
    model: str
    context_per_seq: int
    max_group: int
    max_running: int = 256
    min_kv_tokens: int = field(
        default=48_000, metadata={"help": "a worker must hold one long trajectory"}
    )

    def __post_init__(self) -> None:
        if self.context_per_seq < 1 or self.max_group < 1:
            raise ConfigError("context_per_seq and max_group must be >= 1")

    def latency(self, degree: int) -> LatencyModel:
        return _latency(self.gpu, self.model, degree)

    def feasible(self, degree: int) -> bool:
        try:
            return self.latency(degree).kv_capacity_tokens >= self.min_kv_tokens
        except ConfigError:
            return False

    def __call__(self, degree: int) -> WorkerCost:
        return _cost(self, degree)


@cache
def _latency(gpu: GpuType, model: str, degree: int) -> LatencyModel:
    return RooflineLatencyModel(gpu, model, tp=degree)


@cache
def _cost(model: DegreeCostModel, degree: int) -> WorkerCost:
    return latency_worker_cost(
        model.latency(degree),
        context_per_seq=model.context_per_seq,
        max_group=model.max_group,
        max_running=model.max_running,
    )


@dataclass(frozen=True, kw_only=True)
class FixedPlanner:
    """Homogeneous workers of one degree (verl, slime; Fix-1 / Fix-8)."""

    degree: int

    def plan(self, predicted_lengths: Sequence[float], total_gpus: int) -> WorkerLayout:
        if self.degree < 1 or total_gpus % self.degree:
            raise ConfigError(f"degree {self.degree} does not divide {total_gpus} GPUs")
        return WorkerLayout(degrees=(self.degree,) * (total_gpus // self.degree))


@dataclass(frozen=True, kw_only=True)
class AnnealingPlanner:
    """Heddle's sort-initialized simulated annealing over degrees, scored by the placement DP."""

    cost: CostModel
    degrees: tuple[int, ...] = (1, 2, 4, 8)
    seed: int = 0

    def plan(self, predicted_lengths: Sequence[float], total_gpus: int) -> WorkerLayout:
        return WorkerLayout(degrees=self.allocate(predicted_lengths, total_gpus).degrees)

    def allocate(self, predicted_lengths: Sequence[float], total_gpus: int) -> Allocation:
        """The annealed allocation with its placement of `predicted_lengths` and makespan."""
        allowed = tuple(d for d in self.degrees if self.cost.feasible(d))
        if not allowed:
            raise ConfigError(f"no degree in {self.degrees} can hold a long trajectory's KV")
        return anneal_allocation(
            predicted_lengths, total_gpus, self.cost, degrees=allowed, seed=self.seed
        )
