"""Heddle's per-degree worker cost from measured engine profiles: the `CostModel` a real
rollout plans and places with (the simulator's counterpart is
`loom.sim.rollout.cost.SimulatedDegreeCost`).

NOTE: it lives in `loom.runtime`, not `loom.perf`: it returns the rollout policies'
`WorkerCost`, and `loom.perf` sits below `loom.rollout` (the policies import it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from loom.core.errors import ConfigError
from loom.perf.latency import LatencyModel, ProfiledLatencyModel
from loom.rollout.heddle.placement import WorkerCost
from loom.rollout.heddle.planner import latency_worker_cost

__all__ = ["ProfiledDegreeCost"]


@dataclass(frozen=True, kw_only=True, eq=False)
class ProfiledDegreeCost:
    """T and F for a worker of each profiled tensor-parallel degree, from its latency model
    (`ProfiledLatencyModel`, fitted to an engine's measured iterations), by the same
    arithmetic as the roofline `DegreeCostModel`. A degree without a profile is infeasible."""

    profiles: Mapping[int, LatencyModel] = field(metadata={"help": "latency model by TP degree"})
    context_per_seq: int = field(metadata={"help": "typical resident context of a trajectory"})
    max_group: int = field(metadata={"help": "most trajectories one worker may be given"})
    max_running: int = field(default=256, metadata={"help": "turns an engine runs at once"})
    min_kv_tokens: int = field(
        default=48_000, metadata={"help": "a worker must hold one long trajectory"}
    )
    _costs: dict[int, WorkerCost] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.context_per_seq < 1 or self.max_group < 1 or self.max_running < 1:
            raise ConfigError("context_per_seq, max_group and max_running must be >= 1")
        if not self.profiles:
            raise ConfigError("ProfiledDegreeCost needs at least one engine profile")
        for degree, lat in self.profiles.items():
            if degree != lat.tp:
                raise ConfigError(f"profile given for tp={degree} was measured at tp={lat.tp}")
        object.__setattr__(self, "profiles", MappingProxyType(dict(self.profiles)))

    @classmethod
    def load(
        cls,
        paths: Iterable[str | Path],
        *,
        context_per_seq: int,
        max_group: int,
        max_running: int = 256,
        min_kv_tokens: int = 48_000,
    ) -> ProfiledDegreeCost:
        """Fit each profile CSV (`ProfiledLatencyModel.load`; its `# tp:` header names the
        degree); two profiles of one degree are refused."""
        profiles: dict[int, LatencyModel] = {}
        sources: dict[int, str] = {}
        for path in paths:
            lat = ProfiledLatencyModel.load(path)
            if lat.tp in profiles:
                raise ConfigError(f"two profiles for tp={lat.tp}: {sources[lat.tp]} and {path}")
            profiles[lat.tp], sources[lat.tp] = lat, str(path)
        return cls(
            profiles=profiles,
            context_per_seq=context_per_seq,
            max_group=max_group,
            max_running=max_running,
            min_kv_tokens=min_kv_tokens,
        )

    @property
    def degrees(self) -> tuple[int, ...]:
        """The profiled degrees, ascending."""
        return tuple(sorted(self.profiles))

    def feasible(self, degree: int) -> bool:
        lat = self.profiles.get(degree)
        return lat is not None and lat.kv_capacity_tokens >= self.min_kv_tokens

    def __call__(self, degree: int) -> WorkerCost:
        if degree not in self.profiles:
            raise ConfigError(f"no engine profile for tp={degree}; profiled: {self.degrees}")
        if degree not in self._costs:
            self._costs[degree] = latency_worker_cost(
                self.profiles[degree],
                context_per_seq=self.context_per_seq,
                max_group=self.max_group,
                max_running=self.max_running,
            )
        return self._costs[degree]
