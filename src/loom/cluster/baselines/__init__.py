"""Cluster baselines of RollMux's evaluation (§7.1, §7.5), registered in `CLUSTER_POLICIES`."""

from loom.cluster.baselines.dedicated import GavelPlus, SoloDisaggregated, VerlColocated
from loom.cluster.baselines.heuristics import GreedyMostIdle, RandomFit

__all__ = ["GavelPlus", "GreedyMostIdle", "RandomFit", "SoloDisaggregated", "VerlColocated"]
