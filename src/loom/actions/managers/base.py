"""Resource managers (§5): one interface over CPU cores, GPU chunks and API quotas.

A manager owns some resource keys. The scheduler talks to it in two steps: a `Ledger` (a cheap
copy of free counts per scheduling domain) answers "does this prefix fit at minimum units?" and
arranges elastic units with the manager's DP operator; then `allocate` picks the concrete
cores, GPUs or quota slots for the actions the scheduler selected. Managers are policy state:
they do no I/O and read no clock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loom.core.actions import ActionSpec

if TYPE_CHECKING:
    from loom.actions.tangram.arrange import Arrangement

__all__ = ["Grant", "Ledger", "ResourceManager", "min_units"]


def min_units(action: ActionSpec, key: str) -> int:
    """The least units of `key` the action can run with."""
    return action.demand[key].minimum


@dataclass(frozen=True, kw_only=True)
class Grant:
    """Concrete resources one manager gave one action.

    `domain` is the scheduling domain (a CPU node, a GPU node, an API); `units` the count of
    the manager's unit resource (cores, GPUs, API slots); `cores`/`gpus` the exact devices;
    `overhead_s` the state-restoration time the driver pays before execution starts.
    """

    action_id: str
    manager: str
    domain: str
    units: int
    cores: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    memory_gb: float = 0.0
    overhead_s: float = 0.0


class Ledger(ABC):
    """Free counts per domain for one scheduling pass; `take` never touches real state."""

    @abstractmethod
    def take(self, action: ActionSpec, units: int | None, domain: str | None = None) -> str | None:
        """Reserve the action's demand on this manager's keys (`units` of its unit resource,
        or the minimum when None), in `domain` or one the manager picks. Returns the domain,
        or None (nothing taken) when it does not fit now."""

    @abstractmethod
    def give(self, action: ActionSpec, domain: str, units: int, *, full: bool = False) -> None:
        """Undo a `take` of `units` unit-resource units; with `full`, undo the rest of the
        take too (memory, quota slots)."""

    @abstractmethod
    def free_units(self, domain: str) -> int:
        """Free units of the unit resource in `domain`."""

    @abstractmethod
    def arrange(self, domain: str, durations: Sequence[Mapping[int, float]]) -> Arrangement | None:
        """The optimal split of the domain's free units among elastic tasks (DPArrange with
        this manager's DP operator), or None when they cannot all run."""

    def prefixes(
        self, domain: str, durations: Sequence[Mapping[int, float]]
    ) -> Callable[[int], Arrangement | None]:
        """k -> `arrange(domain, durations[:k])`; unit pools answer every k from one table."""
        return lambda k: self.arrange(domain, durations[:k])


class ResourceManager(ABC):
    """The unified manager interface (§5): breakdown (release after each action) and pool."""

    name: str
    unit_key: str  # the resource whose units the scheduler counts (cores, GPUs, API slots)

    @abstractmethod
    def owns(self, key: str) -> bool:
        """True when this manager manages resource `key`."""

    @abstractmethod
    def validate(self, action: ActionSpec) -> None:
        """Raise ConfigError when the action could never run here (too big, unknown service)."""

    def options(self, action: ActionSpec) -> tuple[int, ...]:
        """Unit counts of the unit resource the action may take here (ascending)."""
        if self.unit_key in action.demand:
            return tuple(v for v in action.demand[self.unit_key].values() if v >= 1)
        return (1,)

    @abstractmethod
    def pinned_domain(self, action: ActionSpec) -> str | None:
        """The domain the action must run in, if one is already fixed (trajectory pinning)."""

    @abstractmethod
    def ledger(self, now: float = 0.0) -> Ledger:
        """A fresh copy of the free counts for one scheduling pass."""

    @abstractmethod
    def allocate(self, action: ActionSpec, units: int, domain: str, now: float) -> Grant:
        """Give concrete resources; the caller guarantees a ledger said this fits."""

    @abstractmethod
    def release(self, action: ActionSpec, grant: Grant, now: float) -> None:
        """Return a grant's resources (the action finished, failed, timed out or was cancelled)."""

    def end_trajectory(self, trajectory_id: str) -> None:  # noqa: B027 - optional hook
        """The trajectory is done: drop its pins and long-lived reservations."""

    def next_change_s(self, now: float) -> float | None:
        """When capacity frees by itself (a quota period rolls over), if it will."""
        return None
