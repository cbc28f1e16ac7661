"""ROSE (seed 002): rollouts on lent serving GPUs. The co-serving executor's policies: memory
sharing of one KV page pool (`memory`) and dual-SLO admission (`admission`)."""

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

__all__ = [
    "ADMISSION_POLICIES",
    "PAGE_BYTES",
    "AdmissionKind",
    "Cut",
    "MemoryConfig",
    "MemorySharing",
    "Role",
    "ServingSlo",
    "StallWatch",
    "admits",
    "pages_for",
    "slack_s",
    "tpot_slack_s",
    "ttft_slack_s",
]
