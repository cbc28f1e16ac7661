"""Cluster-level policy family: decide where an arriving RL job goes (or regroup everything).

Policies decide, the cluster simulator acts: `on_arrival` reads the current group layouts and
returns a `Placement` (one group's layout after admitting the job) or a `Regroup` (every
group's layout, for the offline optimum). Jobs leaving shrink their groups in the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from loom.cluster.group import GroupLayout
from loom.cluster.job import MuxJob
from loom.cluster.params import Testbed
from loom.core.errors import ConfigError
from loom.core.registry import Registry

__all__ = [
    "CLUSTER_POLICIES",
    "ClusterPolicy",
    "ClusterPolicyKind",
    "Decision",
    "Placement",
    "PolicyConfig",
    "Regroup",
]


class ClusterPolicyKind(StrEnum):
    ROLLMUX = "rollmux"
    ROLLMUX_SLO_PRUNE = "rollmux_slo_prune"  # line 4 prunes only groups no job could join
    SOLO_D = "solo_d"
    VERL = "verl"
    GAVEL_PLUS = "gavel_plus"
    RANDOM = "random"
    GREEDY = "greedy"
    OPT = "opt"


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Admit one job: `layout` is its group after admission (`new_group`: a fresh group)."""

    layout: GroupLayout
    new_group: bool
    marginal_cost_h: float
    strategy: str  # "direct", "scale", "isolated", or a baseline's label


@dataclass(frozen=True, kw_only=True)
class Regroup:
    """Replace every group by `layouts` (offline optimum: regrouping is allowed)."""

    layouts: tuple[GroupLayout, ...]


Decision = Placement | Regroup


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """What every cluster policy is built from."""

    bed: Testbed
    max_group_size: int = 5
    migration_s: float = 0.0  # worst-case overhead of long-tail migration per shared rollout
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_group_size < 1:
            raise ConfigError(f"max_group_size must be >= 1, got {self.max_group_size}")


class ClusterPolicy(Protocol):
    def on_arrival(
        self, job: MuxJob, groups: Sequence[GroupLayout], next_group_id: int
    ) -> Decision: ...


CLUSTER_POLICIES: Registry[ClusterPolicyKind, Callable[[PolicyConfig], ClusterPolicy]] = Registry(
    "cluster", ClusterPolicyKind
)
