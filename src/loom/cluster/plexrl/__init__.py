"""PlexRL (seed 004): serviceized LLM execution multiplexed across RL jobs. Its spatio-temporal
resource view (`timeline`), trace-fitting placement (`placement`) and operation scheduling
on a node group (`hrrs`)."""

from loom.cluster.plexrl.hrrs import (
    OP_POLICIES,
    Op,
    OpPolicy,
    OpPolicyKind,
    Plan,
    PlannedOp,
    optimal_plan,
    total_flow_s,
)
from loom.cluster.plexrl.placement import (
    JobPlacement,
    PlacementConfig,
    PlexPlacement,
    fit,
    fit_scan,
)
from loom.cluster.plexrl.timeline import (
    HORIZON_SLOTS,
    Footprint,
    IntervalSet,
    MinSegmentTree,
    Timeline,
)

__all__ = [
    "HORIZON_SLOTS",
    "OP_POLICIES",
    "Footprint",
    "IntervalSet",
    "JobPlacement",
    "MinSegmentTree",
    "Op",
    "OpPolicy",
    "OpPolicyKind",
    "PlacementConfig",
    "Plan",
    "PlannedOp",
    "PlexPlacement",
    "Timeline",
    "fit",
    "fit_scan",
    "optimal_plan",
    "total_flow_s",
]
