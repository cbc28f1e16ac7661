"""Fixed-capacity trace simulation of RL jobs arriving at a shared training cluster (PlexRL §6.3,
Fig. 8): an admission queue in front of the placement, jobs holding their node group's time
windows until they leave.

Policies (the paper names them; what each does here):

* `isolated` — a job needs a node group of its own for its whole run (job-local reservation);
  the queue is served first come, first served.
* `pack` — jobs share groups: the trace-fitting placement puts a job on the most loaded group
  where it fits (least shift there); FCFS queue.
* `spread` — the same placement, ranked as PlexRL ranks (§4.3.2: least Eq. 1 cost, then least
  interference with residents' busy phases, then the least loaded group); FCFS queue.
* `spread_backfill` — PlexRL: `spread` with backfilling. When the queue's head cannot start, its
  reservation is the earliest departure after which it fits (found on a copy of the cluster,
  releasing residents in the order they leave); a later job starts now if it fits and either
  leaves before that time or takes another group than the head's — it never delays the head.

A job's duration is its steps times its period (placements keep jobs' segments apart, so
sharing does not slow them in this model; a shift delays its start by δ). Each event is an
arrival or a departure.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from loom.cluster.plexrl.placement import GroupOrder, PlacementConfig, PlexPlacement
from loom.cluster.plexrl.timeline import Footprint, Timeline
from loom.core.errors import ConfigError
from loom.sim.engine import Engine

__all__ = ["JobRecord", "Sharing", "TraceJob", "TraceResult", "TraceSimulator"]


class Sharing(StrEnum):
    ISOLATED = "isolated"
    PACK = "pack"
    SPREAD = "spread"
    SPREAD_BACKFILL = "spread_backfill"


@dataclass(frozen=True, kw_only=True)
class TraceJob:
    job_id: str
    arrival_s: int
    footprint: Footprint  # one node group's worth of nodes
    steps: int

    @property
    def duration_s(self) -> int:
        return self.steps * self.footprint.period


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    arrival_s: float
    admitted_s: float  # when the placement took it
    start_s: float  # when its first period begins (admission plus its shift)
    end_s: float
    backfilled: bool

    @property
    def wait_s(self) -> float:
        return self.start_s - self.arrival_s

    @property
    def normalized_delay(self) -> float:
        """Wait over its own duration (§6.3: wait_time / job_duration)."""
        return self.wait_s / (self.end_s - self.start_s)


@dataclass
class TraceResult:
    records: list[JobRecord]
    drain_s: float  # first arrival to the last departure
    decisions: int


class TraceSimulator:
    def __init__(
        self,
        jobs: Sequence[TraceJob],
        *,
        groups: int,
        nodes_per_group: int,
        policy: Sharing,
        horizon: int,
        alpha: float = 0.5,
        duty_bound: float = 0.9,
        backfill_depth: int = 16,
    ) -> None:
        if groups < 1 or nodes_per_group < 1:
            raise ConfigError("need >= 1 group of >= 1 node")
        for j in jobs:
            if j.footprint.nodes != nodes_per_group:
                raise ConfigError(
                    f"{j.job_id} needs {j.footprint.nodes} nodes, groups have {nodes_per_group}"
                )
            if j.duration_s + int(alpha * j.footprint.period) > horizon:
                raise ConfigError(f"{j.job_id} runs longer than the horizon ({horizon} s)")
        self.jobs = sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))
        self.policy = Sharing(policy)
        order = GroupOrder.PACK if self.policy == Sharing.PACK else GroupOrder.SPREAD
        cfg = PlacementConfig(
            groups=tuple(
                tuple(range(g * nodes_per_group, (g + 1) * nodes_per_group)) for g in range(groups)
            ),
            alpha=alpha,
            duty_bound=duty_bound,
            order=order,
        )
        self.placement = PlexPlacement(
            Timeline(nodes=groups * nodes_per_group, horizon=horizon), cfg
        )
        self.backfill_depth = backfill_depth
        self.eng = Engine()
        self.queue: list[TraceJob] = []
        self.ends: dict[str, float] = {}  # resident job -> departure
        self.records: list[JobRecord] = []
        self.decisions = 0

    def run(self) -> TraceResult:
        for j in self.jobs:
            self.eng.schedule(float(j.arrival_s), self._arrive, j, priority=1)
        self.eng.run()
        assert not self.queue, f"jobs never admitted: {[j.job_id for j in self.queue]}"
        first = min(j.arrival_s for j in self.jobs)
        return TraceResult(
            sorted(self.records, key=lambda r: r.job_id),
            max(r.end_s for r in self.records) - first,
            self.decisions,
        )

    # ---- events ----------------------------------------------------------------------------
    def _arrive(self, job: TraceJob) -> None:
        self.queue.append(job)
        self._admit()

    def _depart(self, job_id: str) -> None:
        self.placement.release(job_id)
        del self.ends[job_id]
        self._admit()

    def _sync(self) -> None:
        now = int(self.eng.now)
        if now > self.placement.timeline.now:
            self.placement.timeline.advance(now)

    # ---- admission --------------------------------------------------------------------------
    def _try(self, pl: PlexPlacement, job: TraceJob) -> tuple[int, int] | None:
        """Place `job` on `pl` now: (group, start) or None."""
        self.decisions += 1
        if self.policy == Sharing.ISOLATED:
            got = pl.cold_start(job.job_id, job.footprint.nodes, job.duration_s)
        else:
            got = pl.place(job.job_id, job.footprint, job.duration_s)
        return None if got is None else (got.group, got.start)

    def _start(self, job: TraceJob, start: int, backfilled: bool) -> None:
        end = float(start + job.duration_s)
        self.ends[job.job_id] = end
        self.records.append(
            JobRecord(job.job_id, job.arrival_s, self.eng.now, float(start), end, backfilled)
        )
        self.eng.schedule(end, self._depart, job.job_id, priority=0)

    def _admit(self) -> None:
        self._sync()
        while self.queue:
            head = self.queue[0]
            got = self._try(self.placement, head)
            if got is None:
                break
            self.queue.pop(0)
            self._start(head, got[1], False)
        if self.policy == Sharing.SPREAD_BACKFILL and len(self.queue) > 1:
            self._backfill()

    def _reservation(self) -> tuple[float, int]:
        """When and where the head would start, leaving the cluster as it is but for the
        residents' departures in order."""
        head = self.queue[0]
        trial = copy.deepcopy(self.placement)
        for job_id, end in sorted(self.ends.items(), key=lambda kv: (kv[1], kv[0])):
            trial.release(job_id)
            if end > trial.timeline.now:
                trial.timeline.advance(int(end))
            got = trial.place(head.job_id, head.footprint, head.duration_s)
            if got is not None:
                return float(got.start), got.group
        raise AssertionError(f"{head.job_id} fits nowhere even on an empty cluster")

    def _backfill(self) -> None:
        shadow, shadow_group = self._reservation()
        for job in list(self.queue[1 : 1 + self.backfill_depth]):
            got = self._try(self.placement, job)
            if got is None:
                continue
            group, start = got
            if start + job.duration_s <= shadow or group != shadow_group:
                self.queue.remove(job)
                self._start(job, start, True)
            else:
                self.placement.release(job.job_id)  # it would delay the head: undo
