"""Clients of Loom's runtime services."""

from loom.client.rollout import RolloutClient, TrajectoryHandle

__all__ = ["RolloutClient", "TrajectoryHandle"]
