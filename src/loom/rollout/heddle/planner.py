"""Worker layouts for a GPU budget: Heddle's annealed heterogeneous degrees (§6) and the
homogeneous Fix-d baselines, both scored with the same per-degree cost model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from typing import TYPE_CHECKING, Protocol

import numpy as np

from loom.core.errors import ConfigError
from loom.core.topology import GpuType
from loom.core.trajectory import TrajectorySpec
from loom.perf.interference import interference_curve, token_time
from loom.perf.latency import LatencyModel, RooflineLatencyModel
from loom.rollout.heddle.placement import WorkerCost
from loom.rollout.heddle.resource_manager import anneal_allocation
from loom.rollout.policy import WorkerLayout

if TYPE_CHECKING:
    from loom.sim.rollout.simulator import RolloutConfig


class CostModel(Protocol):
    """A WorkerCost per model-parallel degree, and which degrees can hold a trajectory."""

    def __call__(self, degree: int) -> WorkerCost: ...
    def feasible(self, degree: int) -> bool: ...


__all__ = ["AnnealingPlanner", "DegreeCostModel", "FixedPlanner", "SimulatedDegreeCost"]


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
    lat = model.latency(degree)
    fit = max(1, lat.kv_capacity_tokens // model.context_per_seq)
    curve = interference_curve(
        lat, model.max_group, model.context_per_seq, max_batch=min(fit, model.max_running)
    )
    return WorkerCost(token_time=token_time(lat, model.context_per_seq), interference=curve)


class SimulatedDegreeCost:
    """T and F per degree measured by simulation, as Heddle derives F (§5.2, "Interference
    Factor"): groups drawn from historical trajectories run alone on one worker of that
    degree in the rollout simulator. T = makespan / length for the median trajectory alone;
    F(k) = makespan(k) / (longest length · T) for k trajectories taken at evenly spaced
    length quantiles of the history (so a group's short members drop out as they would).
    Sizes between grid points are interpolated; F is made non-decreasing and >= 1."""

    def __init__(
        self,
        history: Sequence[TrajectorySpec],
        config: RolloutConfig,
        max_group: int,
        *,
        grid: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        min_kv_tokens: int = 48_000,
    ) -> None:
        if max_group < 1:
            raise ConfigError("max_group must be >= 1")
        if not history:
            raise ConfigError("SimulatedDegreeCost needs historical trajectories")
        self.history = sorted(history, key=lambda t: (t.output_tokens, t.traj_id))
        self.config = config
        self.max_group = max_group
        self.grid = tuple(sorted({g for g in grid if 1 <= g <= len(self.history)} | {1}))
        self.min_kv_tokens = min_kv_tokens
        self._costs: dict[int, WorkerCost] = {}

    def feasible(self, degree: int) -> bool:
        try:
            lat = _latency(self.config.gpu, self.config.model, degree)
        except ConfigError:
            return False
        return lat.kv_capacity_tokens >= self.min_kv_tokens

    def sample(self, k: int) -> list[TrajectorySpec]:
        """The k longest historical trajectories (k=1: the median), the members of the
        groups whose completion bounds the makespan."""
        n = len(self.history)
        idx = [n // 2] if k == 1 else list(range(n - k, n))
        return [replace(self.history[j], traj_id=i) for i, j in enumerate(idx)]

    def makespan(self, degree: int, trajs: Sequence[TrajectorySpec]) -> float:
        """Simulated makespan of `trajs` alone on one worker of `degree`."""
        from loom.rollout.baselines import CacheAwareRouter, FcfsScheduler
        from loom.sim.rollout.simulator import RolloutSimulator

        sim = RolloutSimulator(
            trajs,
            WorkerLayout(degrees=(degree,)),
            FcfsScheduler(),
            CacheAwareRouter(),
            self.config,
        )
        return sim.run().makespan_s

    def __call__(self, degree: int) -> WorkerCost:
        if degree not in self._costs:
            self._costs[degree] = self._profile(degree)
        return self._costs[degree]

    def _profile(self, degree: int) -> WorkerCost:
        median = self.sample(1)
        token_time = self.makespan(degree, median) / median[0].output_tokens
        sizes = list(self.grid)
        factors = []
        for k in sizes:
            group = self.sample(k)
            longest = max(t.output_tokens for t in group)
            factors.append(self.makespan(degree, group) / (longest * token_time))
        ks = np.arange(self.max_group + 1, dtype=float)
        curve = np.interp(ks, sizes, factors)
        if self.max_group > sizes[-1] and len(sizes) > 1:  # extend the last slope
            slope = (factors[-1] - factors[-2]) / (sizes[-1] - sizes[-2])
            tail = ks > sizes[-1]
            curve[tail] = factors[-1] + slope * (ks[tail] - sizes[-1])
        curve[0] = 1.0
        curve = np.maximum.accumulate(np.maximum(curve, 1.0))
        return WorkerCost(token_time=token_time, interference=curve)


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
        allowed = tuple(d for d in self.degrees if self.cost.feasible(d))
        if not allowed:
            raise ConfigError(f"no degree in {self.degrees} can hold a long trajectory's KV")
        alloc = anneal_allocation(
            predicted_lengths, total_gpus, self.cost, degrees=allowed, seed=self.seed
        )
        return WorkerLayout(degrees=tuple(alloc.degrees))
