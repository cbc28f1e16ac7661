"""Clients of Loom's runtime services."""

from loom.client.actions import ActionClient, ActionError, AsyncActionClient
from loom.client.cluster import ClusterClient, ClusterError, phase, phase_of
from loom.client.rollout import RolloutClient, TrajectoryHandle
from loom.runtime.relay.client import RelayClient

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
