"""Clients of Loom's runtime services."""

from loom.client.actions import ActionClient, ActionError, AsyncActionClient
from loom.client.relay import RelayClient
from loom.client.rollout import RolloutClient, TrajectoryHandle

__all__ = [
    "ActionClient",
    "ActionError",
    "AsyncActionClient",
    "RelayClient",
    "RolloutClient",
    "TrajectoryHandle",
]
