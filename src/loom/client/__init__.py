"""Clients of Loom's runtime services."""

from loom.client.actions import ActionClient, ActionError, AsyncActionClient
from loom.client.cluster import ClusterClient, ClusterError, phase, phase_of
from loom.client.relay import RelayClient
from loom.client.rollout import RolloutClient, TrajectoryHandle

__all__ = [
    "ActionClient",
    "ActionError",
    "AsyncActionClient",
    "ClusterClient",
    "ClusterError",
    "RelayClient",
    "RolloutClient",
    "TrajectoryHandle",
    "phase",
    "phase_of",
]
