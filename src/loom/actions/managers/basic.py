"""Basic manager (§5.1): API quotas and other non-scalable resources.

Each named resource has a concurrency limit (at most that many actions hold it at once) and
optionally a quota per period (at most `quota` starts within each aligned window of
`period_s`). An action may demand several API keys at once; its domain is its first one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from loom.actions.managers.base import Grant, Ledger, ResourceManager
from loom.actions.tangram.arrange import Arrangement, PrefixArrangements
from loom.core.actions import ActionSpec
from loom.core.errors import ConfigError

__all__ = ["ApiLimit", "BasicManager"]


@dataclass(frozen=True, kw_only=True)
class ApiLimit:
    """Limits of one resource key (e.g. `api_quota("google")`)."""

    key: str
    concurrency: int
    quota: int | None = None
    period_s: float = 60.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"{self.key}: concurrency must be >= 1, got {self.concurrency}")
        if self.quota is not None and self.quota < 1:
            raise ConfigError(f"{self.key}: quota must be >= 1 or None, got {self.quota}")
        if not self.period_s > 0:
            raise ConfigError(f"{self.key}: period_s must be > 0, got {self.period_s}")


class BasicManager(ResourceManager):
    """Concurrency- and quota-limited keys; every action takes its minimum of each."""

    name = "basic"
    unit_key = "api"

    def __init__(self, limits: Sequence[ApiLimit]) -> None:
        self.limits = {lim.key: lim for lim in limits}
        if len(self.limits) != len(limits):
            raise ConfigError("basic manager: duplicate resource keys")
        self._in_use = dict.fromkeys(self.limits, 0)
        self._window: dict[str, int] = dict.fromkeys(self.limits, -1)
        self._started = dict.fromkeys(self.limits, 0)
        self._now = 0.0

    # -- helpers ---------------------------------------------------------------------------
    def _keys(self, action: ActionSpec) -> list[str]:
        return [k for k in action.demand if k in self.limits]

    def _roll(self, now: float) -> None:
        self._now = max(self._now, now)
        for key, lim in self.limits.items():
            w = math.floor(self._now / lim.period_s)
            if w != self._window[key]:
                self._window[key] = w
                self._started[key] = 0

    def used_in_window(self, key: str) -> int:
        return self._started[key]

    def in_use(self, key: str) -> int:
        return self._in_use[key]

    # -- ResourceManager -------------------------------------------------------------------
    def owns(self, key: str) -> bool:
        return key in self.limits

    def validate(self, action: ActionSpec) -> None:
        for key in self._keys(action):
            need = action.demand[key].minimum
            if need > self.limits[key].concurrency:
                raise ConfigError(
                    f"action {action.action_id!r} needs {need} of {key!r}, "
                    f"whose concurrency limit is {self.limits[key].concurrency}"
                )

    def pinned_domain(self, action: ActionSpec) -> str | None:
        keys = self._keys(action)
        return keys[0] if keys else None

    def ledger(self, now: float = 0.0) -> Ledger:
        self._roll(now)
        return _BasicLedger(self)

    def allocate(self, action: ActionSpec, units: int, domain: str, now: float) -> Grant:
        self._roll(now)
        for key in self._keys(action):
            need = action.demand[key].minimum
            assert self._in_use[key] + need <= self.limits[key].concurrency, f"{key} over limit"
            self._in_use[key] += need
            self._started[key] += need
        return Grant(action_id=action.action_id, manager=self.name, domain=domain, units=units)

    def release(self, action: ActionSpec, grant: Grant, now: float) -> None:
        self._roll(now)
        for key in self._keys(action):
            self._in_use[key] -= action.demand[key].minimum
            assert self._in_use[key] >= 0, f"{key} released more than it held"

    def next_change_s(self, now: float) -> float | None:
        self._roll(now)
        out: float | None = None
        for key, lim in self.limits.items():
            if lim.quota is not None and self._started[key] >= lim.quota:
                t = (self._window[key] + 1) * lim.period_s
                out = t if out is None else min(out, t)
        return out

    def capacity_now(self, key: str) -> int:
        """How many more units of `key` can start in this window right now."""
        lim = self.limits[key]
        free = lim.concurrency - self._in_use[key]
        if lim.quota is not None:
            free = min(free, lim.quota - self._started[key])
        return max(free, 0)


class _BasicLedger(Ledger):
    def __init__(self, mgr: BasicManager) -> None:
        self._mgr = mgr
        self._free = {k: mgr.capacity_now(k) for k in mgr.limits}

    def take(self, action: ActionSpec, units: int | None, domain: str | None = None) -> str | None:
        keys = self._mgr._keys(action)
        if any(action.demand[k].minimum > self._free[k] for k in keys):
            return None
        for k in keys:
            self._free[k] -= action.demand[k].minimum
        return keys[0] if keys else None

    def give(self, action: ActionSpec, domain: str, units: int, *, full: bool = False) -> None:
        if full:  # API slots are not elastic: only a full undo hands them back
            for k in self._mgr._keys(action):
                self._free[k] += action.demand[k].minimum

    def free_units(self, domain: str) -> int:
        return self._free[domain]

    def arrange(self, domain: str, durations: Sequence[Mapping[int, float]]) -> Arrangement | None:
        from loom.actions.tangram.arrange import dp_arrange

        return dp_arrange(durations, self._free[domain])

    def prefixes(
        self, domain: str, durations: Sequence[Mapping[int, float]]
    ) -> Callable[[int], Arrangement | None]:
        return PrefixArrangements(durations, self._free[domain]).arrangement
