"""Trace-level cluster simulation: arrivals, placements by a cluster policy, departures.

Time is fast-forwarded between decisions: while a group's membership is fixed, each member
advances at the steady rate of the group's round-robin schedule, measured by executing
`samples` meta-iterations with the jobs' actual (sampled) phase times, long-tail migration
included. Cost is the integral of provisioned GPUs times their hourly price.

SLO attainment follows §4.2: a job meets its SLO when its co-executed iteration time is at most
`SLO x T_solo`, where T_solo is the solo iteration time the scheduler estimated from worst-case
phase durations (every response at the maximum length, §4.2 and §6's profiler). The slowdown
against the job's actual solo time (same sampled durations, alone) is kept as a diagnostic: no
scheduler can bound it, since a job whose own phases came out short can still wait on a
partner's phases that did not.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from loom.cluster.group import GroupLayout
from loom.cluster.job import MuxJob
from loom.cluster.params import NoiseModel, Testbed, noise_model
from loom.cluster.policy import ClusterPolicy, Placement, Regroup
from loom.cluster.schedule import GroupSchedule, run_round_robin
from loom.sim.cluster.times import IterationSampler
from loom.sim.engine import Engine
from loom.sim.metrics import GpuMeter

__all__ = ["ClusterResult", "ClusterSimulator", "JobOutcome"]


@runtime_checkable
class Regrouping(Protocol):
    """A policy that may re-plan every group after departures (the offline optimum)."""

    def regroup(self, groups: Sequence[GroupLayout], next_group_id: int) -> Regroup | None: ...


@dataclass(frozen=True, kw_only=True)
class JobOutcome:
    job_id: str
    kind: str
    arrival_s: float
    finish_s: float
    iterations: int
    solo_iteration_s: float  # actual times, alone on dedicated pools
    planned_solo_s: float  # T_solo of §4.2: worst-case times, alone on dedicated pools
    slo: float

    @property
    def iteration_s(self) -> float:
        return (self.finish_s - self.arrival_s) / self.iterations

    @property
    def slowdown(self) -> float:
        """Co-executed iteration time over T_solo (§4.2), the quantity the SLO bounds."""
        return self.iteration_s / self.planned_solo_s

    @property
    def actual_slowdown(self) -> float:
        """Co-executed iteration time over the job's actual solo iteration time."""
        return self.iteration_s / self.solo_iteration_s

    @property
    def slo_met(self) -> bool:
        return self.slowdown <= self.slo * (1 + 1e-6)

    @property
    def slo_met_vs_actual_solo(self) -> bool:
        return self.actual_slowdown <= self.slo * (1 + 1e-6)


@dataclass(kw_only=True)
class ClusterResult:
    outcomes: list[JobOutcome]
    span_s: float
    cost_usd: float
    peak_rollout_gpus: int
    peak_training_gpus: int
    gpu_s: dict[str, float]  # provisioned GPU-seconds per pool
    busy_gpu_s: dict[str, float]  # GPU-seconds doing a phase, per pool
    decision_ms: list[float] = field(default_factory=list)
    series: list[tuple[float, float, int, int]] = field(default_factory=list)  # t, $/h, R, T
    layouts: list[tuple[float, tuple[GroupLayout, ...]]] = field(default_factory=list)  # t, groups

    @property
    def cost_per_h(self) -> float:
        return self.cost_usd / (self.span_s / 3600) if self.span_s > 0 else 0.0

    @property
    def slo_attainment(self) -> float:
        return sum(o.slo_met for o in self.outcomes) / max(len(self.outcomes), 1)

    @property
    def slo_attainment_vs_actual_solo(self) -> float:
        return sum(o.slo_met_vs_actual_solo for o in self.outcomes) / max(len(self.outcomes), 1)

    def bubble_share(self, pool: str) -> float:
        gpu = self.gpu_s.get(pool, 0.0)
        return 1.0 - self.busy_gpu_s.get(pool, 0.0) / gpu if gpu > 0 else 0.0


@dataclass(frozen=True)
class _Rate:
    period_s: float  # per member, seconds per iteration
    roll_busy: float  # rollout GPU-seconds per iteration
    train_busy: float  # training GPU-seconds per iteration


class ClusterSimulator:
    """Runs one policy over one job list; same seed, same result."""

    def __init__(
        self,
        bed: Testbed,
        *,
        seed: int = 0,
        migration: bool = True,
        noise: NoiseModel | None = None,
        samples: int = 16,
    ) -> None:
        self.bed, self.migration = bed, migration
        self.noise = noise or noise_model()
        self.sampler = IterationSampler(seed, self.noise, samples)
        self.samples = samples
        self._rates: dict[tuple[object, ...], list[_Rate]] = {}

    # -- group execution ---------------------------------------------------------------------
    def schedule(
        self, layout: GroupLayout, iterations: int, *, record: bool = True
    ) -> GroupSchedule:
        """`iterations` meta-iterations of a group with the jobs' actual phase times, every
        phase recorded unless `record` is False (Gantt charts read the records)."""
        return run_round_robin(
            layout,
            self.sampler.durations(layout),
            iterations,
            migration=self.migration,
            tail_gpu_frac=self.noise.tail_gpu_frac,
            migration_s=self.noise.migration_s,
            record=record,
        )

    def group_rates(self, layout: GroupLayout) -> list[_Rate]:
        key = (
            layout.rollout_nodes,
            layout.train_nodes,
            layout.colocated,
            tuple((m.job.job_id, m.job.roll_s, m.nodes) for m in layout.members),
        )
        if key not in self._rates:
            self._rates[key] = self._measure(layout)
        return self._rates[key]

    def _measure(self, layout: GroupLayout) -> list[_Rate]:
        g = self.bed.gpus_per_node
        out = []
        if layout.colocated:
            for m in layout.members:
                ts = [self.sampler.times(m.job, k) for k in range(self.samples)]
                roll = sum(t.roll_head_s + t.roll_tail_s for t in ts) / len(ts)
                train = sum(t.train_s for t in ts) / len(ts)
                gpus = layout.train_nodes * g
                out.append(_Rate(roll + train, 0.0, (roll + train) * gpus))
            return out
        sched = self.schedule(layout, self.samples, record=False)
        for i, m in enumerate(layout.members):
            ts = [self.sampler.times(m.job, k) for k in range(self.samples)]
            roll = sum(t.roll_head_s + t.roll_tail_s for t in ts) / len(ts)
            train = sum(t.train_s for t in ts) / len(ts)
            period = (
                sched.period_s(i, self.samples - 1)
                if len(layout.members) > 1
                else sched.period_s(i)
            )
            out.append(_Rate(period, roll * len(m.nodes) * g, train * layout.train_nodes * g))
        return out

    # -- the trace ---------------------------------------------------------------------------
    def run(self, policy: ClusterPolicy, jobs: Sequence[MuxJob]) -> ClusterResult:
        eng = Engine()
        by_id = {j.job_id: j for j in jobs}
        groups: dict[int, GroupLayout] = {}
        where: dict[str, int] = {}
        progress: dict[str, float] = {}
        rate: dict[str, _Rate] = {}
        finish_ev: dict[str, int] = {}
        outcomes: list[JobOutcome] = []
        acc = {"cost": 0.0, "last": 0.0}
        meter = GpuMeter()
        series: list[tuple[float, float, int, int]] = []
        layouts: list[tuple[float, tuple[GroupLayout, ...]]] = []
        decisions: list[float] = []
        next_gid = 0

        def advance() -> None:
            dt = eng.now - acc["last"]
            if dt <= 0:
                return
            r_nodes = sum(g.rollout_nodes for g in groups.values())
            t_nodes = sum(g.train_nodes for g in groups.values())
            acc["cost"] += self.bed.cost_per_h(r_nodes, t_nodes) * dt / 3600
            meter.hold("rollout", r_nodes * self.bed.gpus_per_node, acc["last"], eng.now)
            meter.hold("training", t_nodes * self.bed.gpus_per_node, acc["last"], eng.now)
            for jid, r in rate.items():
                progress[jid] += dt / r.period_s
                meter.use("rollout", r.roll_busy * dt / r.period_s)
                meter.use("training", r.train_busy * dt / r.period_s)
            acc["last"] = eng.now

        def snapshot() -> None:
            r_nodes = sum(g.rollout_nodes for g in groups.values())
            t_nodes = sum(g.train_nodes for g in groups.values())
            g = self.bed.gpus_per_node
            series.append(
                (eng.now, self.bed.cost_per_h(r_nodes, t_nodes), r_nodes * g, t_nodes * g)
            )
            layouts.append((eng.now, tuple(groups.values())))

        def refresh(layout: GroupLayout) -> None:
            for m, r in zip(layout.members, self.group_rates(layout), strict=True):
                jid = m.job.job_id
                rate[jid], where[jid] = r, layout.group_id
                if jid in finish_ev:
                    eng.cancel(finish_ev[jid])
                left = max(by_id[jid].iterations - progress[jid], 0.0)
                finish_ev[jid] = eng.after(left * r.period_s, depart, jid, priority=0)

        def apply(decision: Placement | Regroup) -> None:
            nonlocal next_gid
            if isinstance(decision, Regroup):
                groups.clear()
                for layout in decision.layouts:
                    groups[layout.group_id] = layout
            else:
                groups[decision.layout.group_id] = decision.layout
            changed = decision.layouts if isinstance(decision, Regroup) else (decision.layout,)
            for layout in changed:
                next_gid = max(next_gid, layout.group_id + 1)
                refresh(layout)

        def arrive(job: MuxJob) -> None:
            advance()
            progress[job.job_id] = 0.0
            t0 = time.perf_counter()
            decision = policy.on_arrival(job, tuple(groups.values()), next_gid)
            decisions.append((time.perf_counter() - t0) * 1e3)
            apply(decision)
            snapshot()

        def depart(jid: str) -> None:
            advance()
            job = by_id[jid]
            outcomes.append(
                JobOutcome(
                    job_id=jid,
                    kind=job.kind,
                    arrival_s=job.arrival_s,
                    finish_s=eng.now,
                    iterations=job.iterations,
                    solo_iteration_s=self.sampler.solo_iteration_s(job),
                    planned_solo_s=job.solo_s,
                    slo=job.slo,
                )
            )
            del rate[jid], finish_ev[jid]
            gid = where.pop(jid)
            shrunk = groups[gid].without([jid])
            if shrunk.members:
                groups[gid] = shrunk  # NOTE: in place: policies see groups in creation order
            else:
                del groups[gid]
            forget = getattr(policy, "forget", None)
            if forget is not None:
                forget([jid])
            plan = (
                policy.regroup(tuple(groups.values()), next_gid)
                if isinstance(policy, Regrouping) and groups
                else None
            )
            if plan is not None:
                apply(plan)
            elif shrunk.members:
                refresh(shrunk)
            snapshot()

        for job in sorted(jobs, key=lambda j: (j.arrival_s, j.job_id)):
            eng.schedule(job.arrival_s, arrive, job, priority=1)
        eng.run()
        start = min((j.arrival_s for j in jobs), default=0.0)
        assert len(outcomes) == len(jobs), "every job must finish"
        return ClusterResult(
            outcomes=sorted(outcomes, key=lambda o: o.job_id),
            span_s=eng.now - start,
            cost_usd=acc["cost"],
            peak_rollout_gpus=max((s[2] for s in series), default=0),
            peak_training_gpus=max((s[3] for s in series), default=0),
            gpu_s={p: meter.provisioned[p] for p in ("rollout", "training")},
            busy_gpu_s={p: meter.busy[p] for p in ("rollout", "training")},
            decision_ms=decisions,
            series=series,
            layouts=layouts,
        )
