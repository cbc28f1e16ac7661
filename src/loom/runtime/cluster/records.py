"""What the cluster service records, and the moves its records may make: an operation's
status (`OP_TRANSITIONS`) and a deployment's (`DEPLOYMENT_TRANSITIONS`); a move a table does not
allow raises `IllegalTransition`. `ClusterCore` (`core`) makes the moves."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from loom.cluster.plexrl.placement import JobPlacement

__all__ = [
    "DEPLOYMENT_TRANSITIONS",
    "OP_TRANSITIONS",
    "Deployment",
    "DeploymentStatus",
    "IllegalTransition",
    "OpRecord",
    "OpStatus",
]


class IllegalTransition(AssertionError):
    """A record was asked to move where its table does not allow: a bug in the core."""


class OpStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return not OP_TRANSITIONS[self]


OP_TRANSITIONS: dict[OpStatus, frozenset[OpStatus]] = {
    OpStatus.QUEUED: frozenset({OpStatus.RUNNING, OpStatus.FAILED, OpStatus.CANCELLED}),
    OpStatus.RUNNING: frozenset({OpStatus.SUCCEEDED, OpStatus.FAILED, OpStatus.CANCELLED}),
    OpStatus.SUCCEEDED: frozenset(),
    OpStatus.FAILED: frozenset(),
    OpStatus.CANCELLED: frozenset(),
}


class DeploymentStatus(StrEnum):
    READY = "ready"  # its ranks run (its state resident or offloaded)
    RECOVERING = "recovering"  # its ranks were torn down; being started again or failed
    FAILED = "failed"  # torn down for good: its error says why (delete the job to go on)


DEPLOYMENT_TRANSITIONS: dict[DeploymentStatus, frozenset[DeploymentStatus]] = {
    DeploymentStatus.READY: frozenset({DeploymentStatus.RECOVERING}),
    DeploymentStatus.RECOVERING: frozenset({DeploymentStatus.READY, DeploymentStatus.FAILED}),
    DeploymentStatus.FAILED: frozenset(),
}


@dataclass
class OpRecord:
    op_id: int
    deployment: str
    job: str
    kind: str
    payload: dict[str, Any]
    submitted_s: float
    status: OpStatus = OpStatus.QUEUED
    started_s: float | None = None
    ended_s: float | None = None
    setup_s: float = 0.0  # the switch paid before it
    override_s: float | None = None  # the deadline its caller named
    deadline_s: float | None = None  # how long it may run, set when it starts
    result: dict[str, Any] | None = None
    error: str | None = None
    system: bool = False  # an offload or load the scheduler inserted

    def move(self, to: OpStatus) -> None:
        if to not in OP_TRANSITIONS[self.status]:
            raise IllegalTransition(f"operation {self.op_id}: {self.status} -> {to}")
        self.status = to

    def view(self) -> dict[str, Any]:
        return {
            "op_id": self.op_id,
            "deployment": self.deployment,
            "job": self.job,
            "op": self.kind,
            "status": self.status.value,
            "submitted_s": self.submitted_s,
            "started_s": self.started_s,
            "ended_s": self.ended_s,
            "setup_s": self.setup_s,
            "deadline_s": self.deadline_s,
            "result": self.result,
            "error": self.error,
            "system": self.system,
        }


@dataclass
class Deployment:
    """What the core knows of a deployment (the driver holds its worker group)."""

    id: str
    job: str
    group: int
    seq: int = 0  # operations submitted (their order within the deployment)
    placement: JobPlacement | None = None  # how PlexRL's placement put it there, if it did
    migrating: bool = False
    deleting: bool = False
    status: DeploymentStatus = DeploymentStatus.READY
    error: str | None = None  # why it failed
    restarts: int = 0  # its worker group started again from its offloaded state

    def move(self, to: DeploymentStatus) -> None:
        if to not in DEPLOYMENT_TRANSITIONS[self.status]:
            raise IllegalTransition(f"deployment {self.id}: {self.status} -> {to}")
        self.status = to
