"""Rollout-level simulation: continuous-batching workers, prefix caches, KV migration."""

from loom.sim.rollout.cost import SimulatedDegreeCost
from loom.sim.rollout.simulator import RolloutConfig, RolloutResult, RolloutSimulator

__all__ = ["RolloutConfig", "RolloutResult", "RolloutSimulator", "SimulatedDegreeCost"]
