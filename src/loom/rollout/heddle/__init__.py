"""Heddle (seed 003): trajectory-centric rollout — progressive prediction and priority
scheduling, presorted-DP placement with migration, and adaptive model parallelism."""

from loom.rollout.heddle.placement import Placement, WorkerCost, presorted_dp, presorted_dp_hetero
from loom.rollout.heddle.planner import (
    AnnealingPlanner,
    CostModel,
    DegreeCostModel,
    FixedPlanner,
)
from loom.rollout.heddle.predictor import (
    ProgressivePredictor,
    PromptHistoryPredictor,
    PromptModelPredictor,
)
from loom.rollout.heddle.resource_manager import Allocation, anneal_allocation
from loom.rollout.heddle.router import HeddleRouter
from loom.rollout.heddle.scheduler import ProgressivePriorityScheduler
from loom.rollout.heddle.transmission import MigrationRequest, select_batch

__all__ = [
    "Allocation",
    "AnnealingPlanner",
    "CostModel",
    "DegreeCostModel",
    "FixedPlanner",
    "HeddleRouter",
    "MigrationRequest",
    "Placement",
    "ProgressivePredictor",
    "ProgressivePriorityScheduler",
    "PromptHistoryPredictor",
    "PromptModelPredictor",
    "WorkerCost",
    "anneal_allocation",
    "presorted_dp",
    "presorted_dp_hetero",
    "select_batch",
]
