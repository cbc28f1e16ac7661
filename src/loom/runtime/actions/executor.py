"""What the driver asks of the code that executes one kind of action."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from loom.actions.policy import Start
from loom.runtime.actions.record import Outcome
from loom.runtime.actions.schemas import ActionRequest

__all__ = ["ExecContext", "Executor"]


@dataclass(frozen=True, kw_only=True)
class ExecContext:
    """One granted action: its request, the policy's `Start`, its time limit, the trajectory's
    workspace, and a callback to say that execution proper has begun."""

    request: ActionRequest
    start: Start
    timeout_s: float
    workspace: Path
    started: Callable[[], None]


class Executor(Protocol):
    async def run(self, ctx: ExecContext) -> Outcome:
        """Execute the action; past `ctx.timeout_s` stop it and return TIMED_OUT. When the
        task is cancelled, stop the execution, wait until it has truly stopped (its resources
        are free to give to another action), then re-raise."""
        ...

    async def close(self) -> None:
        """Release what the executor holds (clients, device memory)."""
        ...
