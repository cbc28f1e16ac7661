"""Historical T_ori per action kind: the estimate an action submitted without a profile gets
(§4.2: non-scalable durations may be approximated by historical averages)."""

from __future__ import annotations

from loom.core.actions import ActionKind, ActionSpec

__all__ = ["DurationHistory"]


class DurationHistory:
    """An exponential moving average, per kind, of T_ori = exec time × E(m)·m (Eq. 1)."""

    def __init__(self, weight: float = 0.2) -> None:
        assert 0.0 < weight <= 1.0, f"weight must be in (0, 1], got {weight}"
        self.weight = weight
        self._mean: dict[ActionKind, float] = {}

    def add(self, action: ActionSpec, units: int, exec_s: float) -> None:
        t_ori = exec_s * action.speedup(units)
        old = self._mean.get(action.kind)
        self._mean[action.kind] = t_ori if old is None else old + self.weight * (t_ori - old)

    def t_ori_s(self, kind: ActionKind) -> float:
        """The average so far (0.0 before any action of this kind has run)."""
        return self._mean.get(kind, 0.0)
