"""What the driver has handed out: the cores and GPUs of running actions. The managers already
guarantee exclusivity; this is the driver's own check that it never runs two actions on one
core or one GPU, or an action on a core it does not schedule."""

from __future__ import annotations

from collections.abc import Iterable

from loom.actions.policy import Start

__all__ = ["Claims"]


class Claims:
    def __init__(self, cores: Iterable[int]) -> None:
        self.cores = frozenset(cores)
        self.busy_cores: set[int] = set()
        self.busy_gpus: set[tuple[str, int]] = set()  # (node, GPU)

    @staticmethod
    def _gpus(start: Start) -> set[tuple[str, int]]:
        return {(g.domain, d) for g in start.grants for d in g.gpus}

    def claim(self, start: Start) -> None:
        """Mark a start's cores and GPUs busy; an AssertionError (nothing marked) when any of
        them does not exist or is busy."""
        aid = start.action.action_id
        cores, gpus = set(start.cores), self._gpus(start)
        assert len(cores) == len(start.cores), f"{aid}: a core granted twice"
        assert cores <= self.cores, f"{aid}: cores {sorted(cores - self.cores)} do not exist"
        assert not cores & self.busy_cores, f"{aid}: cores {sorted(cores & self.busy_cores)} busy"
        assert not gpus & self.busy_gpus, f"{aid}: GPUs {sorted(gpus & self.busy_gpus)} busy"
        self.busy_cores |= cores
        self.busy_gpus |= gpus

    def release(self, start: Start) -> None:
        self.busy_cores -= set(start.cores)
        self.busy_gpus -= self._gpus(start)
