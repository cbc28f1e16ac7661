"""Cluster-level simulator: RL jobs arriving, grouped by a cluster policy, leaving."""

from loom.sim.cluster.simulator import ClusterResult, ClusterSimulator, JobOutcome
from loom.sim.cluster.times import IterationSampler

__all__ = ["ClusterResult", "ClusterSimulator", "IterationSampler", "JobOutcome"]
