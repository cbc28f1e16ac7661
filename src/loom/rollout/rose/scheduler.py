"""ROSE's elastic rollout scheduler (§4.3): each turn of a trajectory goes to the worker that
holds its prefix if that worker can take it, else to the least-loaded dedicated rollout
worker under its concurrency cap, else to the least-loaded eligible lent serving worker, else
it waits in a central queue and is offered again when capacity changes.

A lent worker is eligible when it is alive, activated, at the current weight version, has the
pages the turn needs and a non-negative serving-SLO slack; a dedicated worker when it is alive,
current and under its cap (§6 and App. A: 16 running requests per GPU). Aborted, stalled and
failed turns come back through `submit` with their partial output kept by the caller. Table 3's
baselines are variants: `pin` keeps a trajectory on the worker of its first turn (that worker's
own queue absorbs the load; only a worker that died or fell behind the weights releases it),
and `turn_wise` routes turn by turn without cache affinity.

A plain object over worker views: no I/O, no clock of its own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Protocol

from loom.core.errors import ConfigError
from loom.core.registry import Registry

__all__ = [
    "ROSE_ROUTERS",
    "ElasticRouter",
    "RoseWorkerView",
    "RoutingKind",
    "WorkerKind",
]

CAP_PER_GPU = 16  # App. A: rollout throughput saturates at 16 running requests per GPU


class WorkerKind(StrEnum):
    DEDICATED = "dedicated"  # a GPU of the RL job's own rollout pool
    LENT = "lent"  # a serving instance lent to the job (co-served)


class RoutingKind(StrEnum):
    ROSE = "rose"  # turn-wise with cache affinity (§4.3)
    TURN_WISE = "turn_wise"  # Table 3: turn-wise, no affinity
    PIN = "pin"  # Table 3's baseline: a trajectory stays on one worker


class RoseWorkerView(Protocol):
    """What the scheduler reads of a worker."""

    @property
    def idx(self) -> int: ...
    @property
    def kind(self) -> WorkerKind: ...
    @property
    def gpus(self) -> int: ...
    @property
    def running(self) -> int: ...  # rollout requests assigned to it (running or queued there)
    @property
    def alive(self) -> bool: ...
    @property
    def activated(self) -> bool: ...  # rollout model resident (lent) or started (dedicated)
    @property
    def version(self) -> int: ...  # weight version it serves
    @property
    def free_pages(self) -> int: ...  # pages the rollout may still take (lent)
    @property
    def slack_s(self) -> float: ...  # serving-SLO slack now (lent; +inf for dedicated)
    def holds_prefix(self, traj_id: int) -> bool: ...


@dataclass(frozen=True)
class _Turn:
    traj_id: int
    new_pages: int  # pages it needs where its prefix is cached
    context_pages: int  # pages it needs anywhere else (its whole context)


class ElasticRouter:
    """Routes turns over dedicated and lent workers; holds what fits nowhere."""

    def __init__(
        self,
        kind: RoutingKind = RoutingKind.ROSE,
        *,
        cap_per_gpu: int = CAP_PER_GPU,
    ) -> None:
        if cap_per_gpu < 1:
            raise ConfigError(f"cap_per_gpu must be >= 1, got {cap_per_gpu}")
        self.kind = RoutingKind(kind)
        self.cap_per_gpu = cap_per_gpu
        self.version = 0
        self._last: dict[int, int] = {}  # trajectory -> worker of its latest turn (or pin)
        self._queue: OrderedDict[int, _Turn] = OrderedDict()  # central queue, FIFO

    # ---- views ---------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self._queue)

    def queued_ids(self) -> list[int]:
        return list(self._queue)

    def affine(self, traj_id: int) -> int | None:
        """The worker of the trajectory's latest turn (its pin under `pin`)."""
        return self._last.get(traj_id)

    # ---- decisions -----------------------------------------------------------------------
    def set_version(self, version: int) -> None:
        """The weights of `version` are current: workers behind it are not routable."""
        if version < self.version:
            raise ConfigError(f"weight version {version} is older than {self.version}")
        self.version = version

    def submit(
        self,
        traj_id: int,
        new_pages: int,
        context_pages: int,
        workers: Sequence[RoseWorkerView],
    ) -> int | None:
        """A turn of `traj_id` is ready (first turn, after a tool call, or re-routed after an
        abort, a stall or a failure): the worker it goes to, or None when it joins the central
        queue. It needs `new_pages` where its prefix is cached, `context_pages` elsewhere."""
        if traj_id in self._queue:
            raise ConfigError(f"trajectory {traj_id} already has a turn in the central queue")
        if not 0 <= new_pages <= context_pages:
            raise ConfigError(
                f"a turn needs 0 <= new pages <= context pages, got {new_pages}, {context_pages}"
            )
        turn = _Turn(traj_id, new_pages, context_pages)
        target = self._place(turn, workers, {})
        if target is None:
            self._queue[traj_id] = turn
        return target

    def drain(self, workers: Sequence[RoseWorkerView]) -> list[tuple[int, int]]:
        """Capacity changed: place the queued turns that now fit, in arrival order (a turn
        that fits nowhere does not hold back those behind it). Each placement counts against
        its worker for the ones after it, as the caller will apply them all."""
        out: list[tuple[int, int]] = []
        taken: dict[int, tuple[int, int]] = {}  # worker -> (requests, pages) placed here now
        # A turn that fits nowhere but its affine worker shows that no other worker has that
        # many pages free: later turns that need as many skip the scan (placements only
        # take room away). The drain stops once no worker has a free slot.
        floor = None
        slots = {w.idx: self.cap_per_gpu * w.gpus - w.running for w in workers if self._current(w)}
        open_slots = sum(1 for n in slots.values() if n > 0)
        for traj_id, turn in list(self._queue.items()):
            if not open_slots:
                break
            if (
                floor is not None
                and turn.context_pages >= floor
                and not self._affine_fits(turn, workers, taken)
            ):
                continue
            target = self._place(turn, workers, taken)
            if target is None:
                floor = turn.context_pages if floor is None else min(floor, turn.context_pages)
                continue
            del self._queue[traj_id]
            out.append((traj_id, target))
            slots[target] -= 1
            open_slots -= slots[target] == 0
            n, p = taken.get(target, (0, 0))
            pages = turn.new_pages if workers[target].holds_prefix(traj_id) else turn.context_pages
            taken[target] = (n + 1, p + pages)
        return out

    def withdraw(self, traj_id: int) -> bool:
        """Take a queued turn back (its trajectory was cancelled)."""
        return self._queue.pop(traj_id, None) is not None

    def release(self, traj_id: int) -> None:
        """The trajectory's worker gave its turn back (a memory cut, a stall, a failure):
        its affinity or pin no longer holds, so its next `submit` places it afresh."""
        self._last.pop(traj_id, None)

    def finish(self, traj_id: int) -> None:
        """The trajectory ended: forget its affinity."""
        self._last.pop(traj_id, None)
        self._queue.pop(traj_id, None)

    # ---- internals -----------------------------------------------------------------------
    def _affine_fits(
        self, turn: _Turn, workers: Sequence[RoseWorkerView], taken: dict[int, tuple[int, int]]
    ) -> bool:
        last = self._last.get(turn.traj_id)
        if last is None or self.kind == RoutingKind.TURN_WISE:
            return False
        w = workers[last]
        if self.kind == RoutingKind.PIN:
            return self._current(w)
        return w.holds_prefix(turn.traj_id) and self._fits(w, turn.new_pages, taken)

    def _current(self, w: RoseWorkerView) -> bool:
        return w.alive and w.activated and w.version == self.version

    def _fits(self, w: RoseWorkerView, pages: int, taken: dict[int, tuple[int, int]]) -> bool:
        n, p = taken.get(w.idx, (0, 0))
        if not self._current(w) or w.running + n >= self.cap_per_gpu * w.gpus:
            return False
        if w.kind == WorkerKind.LENT:
            return w.free_pages - p >= pages and w.slack_s >= 0.0
        return True

    def _place(
        self,
        turn: _Turn,
        workers: Sequence[RoseWorkerView],
        taken: dict[int, tuple[int, int]],
    ) -> int | None:
        last = self._last.get(turn.traj_id)
        if self.kind == RoutingKind.PIN and last is not None:
            if self._current(workers[last]):
                return last  # its own queue absorbs the load
        elif self.kind == RoutingKind.ROSE and last is not None:
            w = workers[last]
            if w.holds_prefix(turn.traj_id) and self._fits(w, turn.new_pages, taken):
                return last
        target = self._least_loaded(workers, turn.context_pages, WorkerKind.DEDICATED, taken)
        if target is None:
            target = self._least_loaded(workers, turn.context_pages, WorkerKind.LENT, taken)
        if target is not None:
            self._last[turn.traj_id] = target
        return target

    def _least_loaded(
        self,
        workers: Sequence[RoseWorkerView],
        pages: int,
        kind: WorkerKind,
        taken: dict[int, tuple[int, int]],
    ) -> int | None:
        best, best_load = None, 0.0
        for w in workers:
            if w.kind != kind or not self._fits(w, pages, taken):
                continue
            load = (w.running + taken.get(w.idx, (0, 0))[0]) / w.gpus
            if best is None or load < best_load:
                best, best_load = w.idx, load
        return best


# Each kind builds its router: `ROSE_ROUTERS.get("pin")(cap_per_gpu=16)`.
ROSE_ROUTERS: Registry[RoutingKind, Callable[..., ElasticRouter]] = Registry(
    "rose routing", RoutingKind
)
for _kind in RoutingKind:
    ROSE_ROUTERS.add(_kind, partial(ElasticRouter, _kind))
