"""Action-level simulation: trajectories' tool and reward calls on a testbed of external
resources, scheduled by any registered action policy."""

from loom.sim.actions.plan import ActionStep, Stage, TrajectoryPlan
from loom.sim.actions.records import ActionRecord, SimResult, StepRecord, TrajectoryRecord
from loom.sim.actions.simulator import ActionSimulator, SimConfig, TrajectoryAware
from loom.sim.actions.testbed import ApiProvider, Testbed

__all__ = [
    "ActionRecord",
    "ActionSimulator",
    "ActionStep",
    "ApiProvider",
    "SimConfig",
    "SimResult",
    "Stage",
    "StepRecord",
    "Testbed",
    "TrajectoryAware",
    "TrajectoryPlan",
    "TrajectoryRecord",
]
