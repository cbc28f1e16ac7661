"""ROSE's elastic rollout scheduler (§4.3) as a placement of the rollout router
(`loom serve rollout --placement rose`): the `Router` interface over `ElasticRouter`, with the
central queue the other placements do not have.

An engine is dedicated (the job's own rollout GPUs) unless it is marked lent (a serving
instance lent to the job, co-served). A turn goes to the engine that holds its trajectory's
prefix if that engine can take it, else to the least-loaded dedicated engine under its cap,
else to the least-loaded eligible lent engine; when none can take it `route` returns None and
the turn waits here until `drain` places it. A lent engine is eligible when it is alive, at
the current weight version, and has reported room (`free_tokens`) and a non-negative
serving-SLO slack (`slack_s`) — the co-serving executor on the serving side reports both; an
engine that has reported neither counts as having room. It holds a trajectory's prefix for
`lease_s` after the turn ended (§4.1's lease); a dedicated engine holds it while the
trajectory is there.

The runtime counts KV in tokens: a turn needs its new tokens where its prefix is cached and its
whole context elsewhere. A worker view without ROSE's fields (`lent`, `version`, `alive`,
`free_tokens`, `slack_s`) is a dedicated, live, current engine, so the placement also serves
callers that know nothing of lending (verl's load balancer).

A plain object: no I/O, no clock of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from loom.core.errors import ConfigError
from loom.rollout.policy import ROUTERS, PlacementKind, Router, TrajectoryView, WorkerView
from loom.rollout.rose.scheduler import CAP_PER_GPU, ElasticRouter, RoutingKind, WorkerKind

__all__ = ["LEASE_S", "RosePlacement"]

LEASE_S = 10.0  # §4.1, App. C: a finished turn's prefix stays leased this long on a lent GPU


@dataclass(frozen=True, slots=True)
class _Absent:
    """A worker index with no routable engine behind it (gone, failed, or left out)."""

    idx: int
    kind: WorkerKind = WorkerKind.DEDICATED
    gpus: int = 1
    running: int = 0
    alive: bool = False
    activated: bool = False
    version: int = -1
    free_pages: int = 0
    slack_s: float = -math.inf

    def holds_prefix(self, traj_id: int) -> bool:
        return False


class _View:
    """An engine as `ElasticRouter` reads it."""

    __slots__ = ("_placement", "_w", "activated", "alive", "kind", "version")

    def __init__(self, w: WorkerView, placement: RosePlacement) -> None:
        self._w = w
        self._placement = placement
        self.kind = WorkerKind.LENT if getattr(w, "lent", False) else WorkerKind.DEDICATED
        self.alive = bool(getattr(w, "alive", True))
        self.activated = bool(getattr(w, "activated", True))
        self.version = int(getattr(w, "version", placement.router.version))

    @property
    def idx(self) -> int:
        return self._w.idx

    @property
    def gpus(self) -> int:
        return self._w.tp

    @property
    def running(self) -> int:
        return self._w.load

    @property
    def free_pages(self) -> int:
        free = getattr(self._w, "free_tokens", None)
        return 2**62 if free is None else int(free)

    @property
    def slack_s(self) -> float:
        return float(getattr(self._w, "slack_s", math.inf))

    def holds_prefix(self, traj_id: int) -> bool:
        return self._placement.holds(traj_id, self._w, self.kind)


class RosePlacement(Router):
    """`Router` over `ElasticRouter`; `route` may hold a turn (None) until `drain` places it."""

    central_queue = True

    def __init__(
        self,
        kind: RoutingKind = RoutingKind.ROSE,
        *,
        cap_per_gpu: int = CAP_PER_GPU,
        lease_s: float = LEASE_S,
    ) -> None:
        if lease_s < 0:
            raise ConfigError(f"lease_s must be >= 0, got {lease_s}")
        self.router = ElasticRouter(kind, cap_per_gpu=cap_per_gpu)
        self.lease_s = lease_s
        self._trajs: dict[int, TrajectoryView] = {}  # those with a turn routed or held
        self._now = 0.0
        self._size = 0  # workers indexed so far

    # ---- the Router interface ------------------------------------------------------------
    def route(self, t: TrajectoryView, workers: Sequence[WorkerView], now: float) -> int | None:
        """The engine for `t`'s next turn, or None: it waits in the central queue."""
        self._now = now
        self.router.withdraw(t.traj_id)  # a caller without a central queue asks again
        self._trajs[t.traj_id] = t
        context = _pending_context(t)
        held = t.context if t.host >= 0 else 0
        return self.router.submit(
            t.traj_id, max(0, context - held) + 1, context + 1, self._views(workers)
        )

    def drain(self, workers: Sequence[WorkerView], now: float) -> list[tuple[int, int]]:
        """Capacity changed: the held turns that now fit, as (trajectory id, engine index)."""
        if not self.router.queued:
            return []
        self._now = now
        return self.router.drain(self._views(workers))

    def withdraw(self, traj_id: int) -> bool:
        """A held turn is gone (its client left, the router shuts down)."""
        return self.router.withdraw(traj_id)

    def release(self, traj_id: int) -> None:
        """Its engine gave the turn back (an abort, a stall, a failure): no affinity holds."""
        self.router.release(traj_id)

    def set_version(self, version: int) -> None:
        """Weights of `version` are current: engines behind it take no new turns."""
        self.router.set_version(version)

    def migrate(self, t: TrajectoryView, workers: Sequence[WorkerView], now: float) -> int | None:
        return None  # §4.3: a turn moves only when it is ready, never in a tool call

    def finish(self, t: TrajectoryView) -> None:
        self.router.finish(t.traj_id)
        self._trajs.pop(t.traj_id, None)

    # ---- views ---------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return self.router.queued

    def holds(self, traj_id: int, w: WorkerView, kind: WorkerKind) -> bool:
        """Whether `w` still holds `traj_id`'s prefix: it ran its last turn, and on a lent
        engine the lease has not run out."""
        t = self._trajs.get(traj_id)
        if t is None or t.host != w.idx:
            return False
        if kind is WorkerKind.DEDICATED:
            return True
        ended = getattr(t, "last_end_s", None)
        return ended is None or self._now - ended <= self.lease_s

    def _views(self, workers: Sequence[WorkerView]) -> list[_View | _Absent]:
        """`ElasticRouter` indexes workers by `idx`: a dense list, absent where none is."""
        # NOTE: indices only grow (engines are numbered as they join), so the largest seen
        # covers every affinity the router remembers.
        self._size = max(self._size, max((w.idx for w in workers), default=-1) + 1)
        out: list[_View | _Absent] = [_Absent(i) for i in range(self._size)]
        for w in workers:
            out[w.idx] = _View(w, self)
        return out


def _pending_context(t: TrajectoryView) -> int:
    """Tokens in the prompt of `t`'s next turn (its context plus the new input), where the
    caller knows it; else the context so far."""
    pending = getattr(t, "pending_context", None)
    return int(pending) if pending is not None else t.context


ROUTERS.add(PlacementKind.ROSE, RosePlacement)
