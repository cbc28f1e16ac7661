"""Heddle's per-degree worker cost measured in the rollout simulator: the `CostModel` the
simulated experiments plan and place with (the runtime's counterpart is
`loom.runtime.rollout.cost.ProfiledDegreeCost`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec
from loom.perf.latency import RooflineLatencyModel
from loom.rollout.baselines import CacheAwareRouter, FcfsScheduler
from loom.rollout.heddle.placement import WorkerCost
from loom.rollout.policy import WorkerLayout
from loom.sim.rollout.simulator import RolloutConfig, RolloutSimulator

__all__ = ["SimulatedDegreeCost"]


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
            lat = RooflineLatencyModel(self.config.gpu, self.config.model, tp=degree)
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
