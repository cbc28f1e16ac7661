"""ROSE (seed 002): rollouts on lent serving GPUs. The co-serving executor's policies: memory
sharing of one KV page pool (`memory`) and dual-SLO admission (`admission`); the elastic
rollout scheduler over dedicated and lent workers (`scheduler`), and as the rollout router's
placement (`placement`); which serving instances a job
borrows (`selection`)."""

from loom.rollout.rose.admission import (
    ADMISSION_POLICIES,
    AdmissionKind,
    Role,
    ServingSlo,
    StallWatch,
    admits,
    slack_s,
    tpot_slack_s,
    ttft_slack_s,
)
from loom.rollout.rose.memory import PAGE_BYTES, Cut, MemoryConfig, MemorySharing, pages_for
from loom.rollout.rose.placement import LEASE_S, RosePlacement
from loom.rollout.rose.scheduler import (
    ROSE_ROUTERS,
    ElasticRouter,
    RoseWorkerView,
    RoutingKind,
    WorkerKind,
)
from loom.rollout.rose.selection import ACTIVATION_S, Lending, UsageSample

__all__ = [
    "ACTIVATION_S",
    "ADMISSION_POLICIES",
    "LEASE_S",
    "PAGE_BYTES",
    "ROSE_ROUTERS",
    "AdmissionKind",
    "Cut",
    "ElasticRouter",
    "Lending",
    "MemoryConfig",
    "MemorySharing",
    "Role",
    "RosePlacement",
    "RoseWorkerView",
    "RoutingKind",
    "ServingSlo",
    "StallWatch",
    "UsageSample",
    "WorkerKind",
    "admits",
    "pages_for",
    "slack_s",
    "tpot_slack_s",
    "ttft_slack_s",
]
