"""Rollout level: trajectory-level scheduling, placement and resource policies.

Importing this package registers every scheduler and router in `SCHEDULERS` / `ROUTERS`.
"""

from loom.rollout import baselines as baselines
from loom.rollout.heddle import router as _heddle_router
from loom.rollout.heddle import scheduler as _heddle_scheduler
from loom.rollout.policy import (
    ROUTERS,
    SCHEDULERS,
    PlacementKind,
    ResourcePlanner,
    Router,
    SchedulerKind,
    TrajectoryView,
    TurnScheduler,
    WorkerLayout,
    WorkerView,
)
from loom.rollout.rose import placement as _rose_placement

del _heddle_router, _heddle_scheduler, _rose_placement

__all__ = [
    "ROUTERS",
    "SCHEDULERS",
    "PlacementKind",
    "ResourcePlanner",
    "Router",
    "SchedulerKind",
    "TrajectoryView",
    "TurnScheduler",
    "WorkerLayout",
    "WorkerView",
]
