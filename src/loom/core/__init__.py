"""One vocabulary for all three levels: resources, topology, jobs, trajectories, actions."""

from loom.core.actions import ActionKind, ActionSpec, ActionStatus, Elasticity
from loom.core.errors import ConfigError, LoomError, UnknownPolicyError
from loom.core.jobs import JobStatus, PhaseKind, PhaseSpec, PhaseStatus, RLJobSpec
from loom.core.registry import Registry
from loom.core.resources import (
    DiscreteSet,
    FeasibleSet,
    RangeSet,
    ResourceKind,
    ResourceVector,
    api_quota,
)
from loom.core.topology import Cluster, GpuType, Link, LinkKind, Node, Pool, PoolRole
from loom.core.trajectory import TrajectorySpec, TrajectoryStatus, TurnSpec, WorkloadKind

__all__ = [
    "ActionKind",
    "ActionSpec",
    "ActionStatus",
    "Cluster",
    "ConfigError",
    "DiscreteSet",
    "Elasticity",
    "FeasibleSet",
    "GpuType",
    "JobStatus",
    "Link",
    "LinkKind",
    "LoomError",
    "Node",
    "PhaseKind",
    "PhaseSpec",
    "PhaseStatus",
    "Pool",
    "PoolRole",
    "RLJobSpec",
    "RangeSet",
    "Registry",
    "ResourceKind",
    "ResourceVector",
    "TrajectorySpec",
    "TrajectoryStatus",
    "TurnSpec",
    "UnknownPolicyError",
    "WorkloadKind",
    "api_quota",
]
