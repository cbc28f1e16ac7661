"""What the cluster service does about slow and broken deployments, as plain decisions: how long
an operation may run (`DeadlinePolicy`), and whether a torn-down worker group is started again
from the state its node's StateManager holds or its deployment fails (`RecoveryPolicy`).

The driver measures and acts; these only decide, from values it passes in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from loom.core.errors import ConfigError

__all__ = ["DeadlinePolicy", "Recovery", "RecoveryAction", "RecoveryPolicy"]


@dataclass(frozen=True, kw_only=True)
class DeadlinePolicy:
    """An operation's deadline: `factor` times its expected duration (measured, else the
    deployment's profiled estimate), never under `floor_s`; a caller may name its own."""

    factor: float = 10.0
    floor_s: float = 120.0

    def __post_init__(self) -> None:
        if not (self.factor >= 1 and math.isfinite(self.factor)):
            raise ConfigError(f"a deadline factor must be >= 1, got {self.factor}")
        if not (self.floor_s > 0 and math.isfinite(self.floor_s)):
            raise ConfigError(f"a deadline floor must be > 0 s, got {self.floor_s}")

    def deadline_s(self, expected_s: float | None, override_s: float | None = None) -> float:
        """Seconds the operation may run once started."""
        if override_s is not None:
            return override_s
        return max(self.floor_s, self.factor * (expected_s or 0.0))


class RecoveryAction(StrEnum):
    RESTART = "restart"  # new ranks, their state waiting on the node's sidecar
    FAIL = "fail"  # the deployment is failed, with the reason


@dataclass(frozen=True)
class Recovery:
    action: RecoveryAction
    reason: str  # what broke it (and, when failing, why it is not restarted)


@dataclass(frozen=True, kw_only=True)
class RecoveryPolicy:
    """A worker group torn down (a rank died, wedged or ran past its deadline) is restarted
    only from state its node's sidecar holds whole — its state as of its last offload, when it
    has not been loaded since. A group that broke while its state was on its ranks (resident,
    or half-way through a move) has nothing intact to restart from: its deployment fails.
    At most `max_restarts` restarts per deployment (a group that keeps breaking fails)."""

    max_restarts: int = 3

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ConfigError(f"max_restarts must be >= 0, got {self.max_restarts}")

    def decide(self, *, reason: str, state_intact: bool, restarts: int) -> Recovery:
        if not state_intact:
            return Recovery(
                RecoveryAction.FAIL,
                f"{reason}; its node's StateManager does not hold its state whole (a resident "
                "deployment's state is on its ranks), so it is not restarted",
            )
        if restarts >= self.max_restarts:
            return Recovery(
                RecoveryAction.FAIL, f"{reason}; restarted {restarts} times already, not again"
            )
        return Recovery(RecoveryAction.RESTART, reason)
