"""Job-level (cluster) policies: RollMux, its baselines and the offline optimum.

Importing this package registers every policy in `CLUSTER_POLICIES`.
"""

from loom.cluster import baselines, optimal
from loom.cluster.group import GroupLayout, Member
from loom.cluster.job import MuxJob
from loom.cluster.policy import (
    CLUSTER_POLICIES,
    ClusterPolicy,
    ClusterPolicyKind,
    Decision,
    Placement,
    PolicyConfig,
    Regroup,
)
from loom.cluster.rollmux import RollMuxScheduler

__all__ = [
    "CLUSTER_POLICIES",
    "ClusterPolicy",
    "ClusterPolicyKind",
    "Decision",
    "GroupLayout",
    "Member",
    "MuxJob",
    "Placement",
    "PolicyConfig",
    "Regroup",
    "RollMuxScheduler",
    "baselines",
    "optimal",
]
