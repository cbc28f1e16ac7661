"""PlexRL's runtime scheduling (§4.4): the order in which one node group (one worker-process
group at a time) runs the operations jobs send it.

A node group runs one operation at a time, non-preemptively (per-WPG serial semantics keep a
job's parameter updates in order), and holds one job's state at a time: running another job's
operation first costs a setup C_setup = T_offload + T_load. Each job's operations run in the
order it sent them. A policy returns a `Plan`: every queued operation with its start, end and
the setup charged before it; the driver starts the plan's first entry when the group frees and
asks again on every arrival and completion.

* `hrrs` — Highest Response Ratio with Setup, Eq. 3–4: at each decision point (the group
  frees), the eligible operation with the highest P = 1 + W / (E + 1_switch · C_setup), where
  1_switch compares its job with the job resident on the group (the one that ran last). Setup
  is charged exactly where the job changes.
* `hrrs_alg1` — Algorithm 1 as printed, kept beside `hrrs` because they differ: it scores every
  queued operation once, at `now`, with t_req = E + T_load + T_offload whether or not the job
  changes (setup always added); it sorts once; the first planned operation pays the setup a
  second time on the cursor (line 17) and later job changes pay nothing beyond t_req; and a
  running operation that is not ranked first is stopped (line 18) — Eq. 3 charges setup only
  on a switch and the design is non-preemptive.
* `hrrn` — the classical highest response ratio next, blind to setup (it still pays it).
* `fcfs` — arrival order.

`optimal_plan` is the exact optimum (least total flow time) by dynamic programming over (each
job's progress, the resident job), for checking the heuristics on small instances.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from loom.core.errors import ConfigError
from loom.core.registry import Registry

__all__ = [
    "OP_POLICIES",
    "Op",
    "OpPolicy",
    "OpPolicyKind",
    "Plan",
    "PlannedOp",
    "SetupCost",
    "brute_force_plan",
    "optimal_plan",
    "total_flow_s",
]

SetupCost = Callable[[str, str | None], float]  # (job to run, job resident) -> seconds


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a job on a node group (compute_log_prob, update_actor, ...)."""

    op_id: int
    job: str
    arrival_s: float
    exec_s: float  # E: its estimated execution time
    seq: int = 0  # its place in its job's order

    def __post_init__(self) -> None:
        if not self.exec_s >= 0:
            raise ConfigError(f"operation {self.op_id}: exec_s must be >= 0, got {self.exec_s}")


@dataclass(frozen=True, slots=True)
class PlannedOp:
    op: Op
    start_s: float  # when it runs (after its setup)
    end_s: float
    setup_s: float  # charged just before it (offload + load), 0 when its job is resident
    stops_running: bool = False  # Algorithm 1 only: it preempts the running operation


@dataclass(frozen=True)
class Plan:
    """The group's timeline from now: entries in the order they run, disjoint."""

    entries: tuple[PlannedOp, ...]

    @property
    def next(self) -> PlannedOp | None:
        return self.entries[0] if self.entries else None

    def order(self) -> list[int]:
        return [p.op.op_id for p in self.entries]


class OpPolicyKind(StrEnum):
    HRRS = "hrrs"
    HRRS_ALG1 = "hrrs_alg1"
    HRRN = "hrrn"
    FCFS = "fcfs"
    ROUND_ROBIN = "round_robin"  # RollMux §4.3/§5.1: co-located jobs take turns, a phase each


class OpPolicy(Protocol):
    def plan(
        self,
        queued: Sequence[Op],
        *,
        now: float,
        resident: str | None,
        busy_until: float,
        setup: SetupCost,
        running: Op | None = None,
    ) -> Plan:
        """`queued`: operations waiting; `resident`: the job whose state the group holds (the
        running operation's, else the last one's); `busy_until`: when the running operation
        ends (<= now: the group is free)."""


def _heads(queued: Sequence[Op]) -> dict[str, list[Op]]:
    """Each job's queued operations in its order."""
    by_job: dict[str, list[Op]] = {}
    for op in sorted(queued, key=lambda o: (o.seq, o.arrival_s, o.op_id)):
        by_job.setdefault(op.job, []).append(op)
    return by_job


def _list_schedule(
    queued: Sequence[Op],
    now: float,
    resident: str | None,
    busy_until: float,
    setup: SetupCost,
    key: Callable[[Op, float, str | None], tuple[float, ...]],
) -> Plan:
    """Greedy list scheduling: whenever the group frees, the eligible operation (each job's
    next, arrived by then) with the largest `key` runs, after its setup if its job is not
    resident."""
    pending = {job: list(ops) for job, ops in _heads(queued).items()}
    t = max(now, busy_until)
    out: list[PlannedOp] = []
    while pending:
        heads = [ops[0] for ops in pending.values()]
        ready = [op for op in heads if op.arrival_s <= t]
        if not ready:
            t = min(op.arrival_s for op in heads)
            continue
        op = max(ready, key=lambda o: (*key(o, t, resident), -o.arrival_s, -o.op_id))
        cost = setup(op.job, resident) if op.job != resident else 0.0
        start = t + cost
        end = start + op.exec_s
        out.append(PlannedOp(op, start, end, cost))
        t, resident = end, op.job
        ops = pending[op.job]
        ops.pop(0)
        if not ops:
            del pending[op.job]
    return Plan(tuple(out))


OP_POLICIES: Registry[OpPolicyKind, Callable[[], OpPolicy]] = Registry(
    "operation policy", OpPolicyKind
)


class _ListPolicy:
    """A list scheduler: whenever the group frees, the eligible operation with the largest
    `key` runs (after its setup if its job is not resident)."""

    def key(
        self, op: Op, t: float, resident: str | None, setup: SetupCost, queued: Sequence[Op]
    ) -> tuple[float, ...]:
        raise NotImplementedError

    def plan(
        self,
        queued: Sequence[Op],
        *,
        now: float,
        resident: str | None,
        busy_until: float,
        setup: SetupCost,
        running: Op | None = None,
    ) -> Plan:
        return _list_schedule(
            queued,
            now,
            resident,
            busy_until,
            setup,
            lambda op, t, res: self.key(op, t, res, setup, queued),
        )


@OP_POLICIES.register(OpPolicyKind.HRRS)
class Hrrs(_ListPolicy):
    """Eq. 3–4: P = 1 + W / (E + 1_switch · C_setup)."""

    def key(
        self, op: Op, t: float, resident: str | None, setup: SetupCost, queued: Sequence[Op]
    ) -> tuple[float, ...]:
        s = op.exec_s + (setup(op.job, resident) if op.job != resident else 0.0)
        return (1.0 + (t - op.arrival_s) / s if s > 0 else float("inf"),)


@OP_POLICIES.register(OpPolicyKind.HRRN)
class Hrrn(_ListPolicy):
    """Highest response ratio next, setup-blind: P = 1 + W / E."""

    def key(
        self, op: Op, t: float, resident: str | None, setup: SetupCost, queued: Sequence[Op]
    ) -> tuple[float, ...]:
        return (1.0 + (t - op.arrival_s) / op.exec_s if op.exec_s > 0 else float("inf"),)


@OP_POLICIES.register(OpPolicyKind.FCFS)
class Fcfs(_ListPolicy):
    """Arrival order (each job's own order kept)."""

    def key(
        self, op: Op, t: float, resident: str | None, setup: SetupCost, queued: Sequence[Op]
    ) -> tuple[float, ...]:
        return (-op.arrival_s,)


@OP_POLICIES.register(OpPolicyKind.ROUND_ROBIN)
class RoundRobin:
    """RollMux's intra-group schedule as an operation policy: the jobs sharing the group take
    turns in a fixed cyclic order (by name); a job's turn runs its ready operations back to
    back (its phase), then the next job with work goes. The same runtime, with this policy,
    is RollMux's phase multiplexer (warm starts from host memory, §5.1)."""

    def plan(
        self,
        queued: Sequence[Op],
        *,
        now: float,
        resident: str | None,
        busy_until: float,
        setup: SetupCost,
        running: Op | None = None,
    ) -> Plan:
        order = {job: i for i, job in enumerate(sorted({o.job for o in queued}))}

        def key(op: Op, t: float, res: str | None) -> tuple[float, ...]:
            if op.job == res:
                return (0.0,)  # the turn goes on while its phase has work
            base = order.get(res, -1) if res is not None else -1
            return (-float((order[op.job] - base) % len(order)),)  # next in the cycle

        return _list_schedule(queued, now, resident, busy_until, setup, key)


@OP_POLICIES.register(OpPolicyKind.HRRS_ALG1)
class HrrsAlgorithm1:
    """Algorithm 1, line by line (see the module docstring for where it departs from Eq. 3).
    Per-job order is kept as the runtime must: a job's later operation never precedes its
    earlier one in the plan (ties in score are broken by the job's order)."""

    def plan(
        self,
        queued: Sequence[Op],
        *,
        now: float,
        resident: str | None,
        busy_until: float,
        setup: SetupCost,
        running: Op | None = None,
    ) -> Plan:
        omega: list[tuple[Op, float, bool]] = []  # (op, t_req, is the running one)
        if running is not None:
            omega.append((running, max(0.0, busy_until - now), True))
        for op in queued:
            omega.append((op, op.exec_s + setup(op.job, None), False))  # line 8: always

        def score(item: tuple[Op, float, bool]) -> float:
            op, t_req, _ = item
            wait = now - op.arrival_s
            return (wait + t_req) / t_req if t_req > 0 else float("inf")

        ranked = sorted(omega, key=lambda it: (-score(it), it[0].arrival_s, it[0].op_id))
        ranked = _keep_job_order(ranked)
        cursor = now
        out: list[PlannedOp] = []
        for op, t_req, is_running in ranked:
            charged, stops = 0.0, False
            if not is_running and cursor == now:  # lines 16-19
                charged = setup(op.job, resident)
                cursor += charged
                stops = running is not None
            start = cursor
            end = start + t_req
            out.append(PlannedOp(op, start, end, charged, stops))
            cursor = end
        return Plan(tuple(out))


def _keep_job_order(
    ranked: list[tuple[Op, float, bool]],
) -> list[tuple[Op, float, bool]]:
    """Within each job, hand out its slots in the ranking to its operations in its order."""
    by_job: dict[str, list[tuple[Op, float, bool]]] = {}
    for it in ranked:
        by_job.setdefault(it[0].job, []).append(it)
    for items in by_job.values():
        items.sort(key=lambda it: (not it[2], it[0].seq, it[0].arrival_s, it[0].op_id))
    cursor = {job: 0 for job in by_job}
    out = []
    for it in ranked:
        job = it[0].job
        out.append(by_job[job][cursor[job]])
        cursor[job] += 1
    return out


def total_flow_s(plan: Plan) -> float:
    """Σ (end − arrival) over the plan: what `optimal_plan` minimises."""
    return sum(p.end_s - p.op.arrival_s for p in plan.entries)


def optimal_plan(
    queued: Sequence[Op],
    *,
    now: float,
    resident: str | None,
    busy_until: float,
    setup: SetupCost,
) -> Plan:
    """The non-preemptive order with the least total flow time, by dynamic programming over
    (each job's progress, the resident job): for every state it keeps the Pareto front of
    (time reached, flow so far), since a later time can still pay off. Exponential in the
    number of jobs; for checking heuristics on small instances."""
    jobs = _heads(queued)
    names = sorted(jobs)
    if len(queued) > 16:
        raise ConfigError(
            f"optimal_plan is for small instances (<= 16 operations), got {len(queued)}"
        )
    start_t = max(now, busy_until)
    Label = tuple[float, float, tuple[PlannedOp, ...]]  # (time, flow, entries)
    fronts: dict[tuple[tuple[int, ...], str | None], list[Label]] = {
        (tuple(0 for _ in names), resident): [(start_t, 0.0, ())]
    }
    total = len(queued)
    for _ in range(total):
        nxt: dict[tuple[tuple[int, ...], str | None], list[Label]] = {}
        for (progress, res), labels in fronts.items():
            for j, name in enumerate(names):
                if progress[j] >= len(jobs[name]):
                    continue
                op = jobs[name][progress[j]]
                cost = setup(name, res) if name != res else 0.0
                for t, flow, entries in labels:
                    begin = max(t, op.arrival_s) + cost
                    end = begin + op.exec_s
                    label = (
                        end,
                        flow + end - op.arrival_s,
                        (*entries, PlannedOp(op, begin, end, cost)),
                    )
                    key = ((*progress[:j], progress[j] + 1, *progress[j + 1 :]), name)
                    _insert_pareto(nxt.setdefault(key, []), label)
        fronts = nxt
    best = min((lab for labels in fronts.values() for lab in labels), key=lambda x: (x[1], x[0]))
    return Plan(best[2])


def _insert_pareto(front: list[tuple[float, float, tuple[PlannedOp, ...]]], label) -> None:  # type: ignore[no-untyped-def]
    t, flow, _ = label
    for ot, of, _ in front:
        if ot <= t and of <= flow:
            return
    front[:] = [x for x in front if not (t <= x[0] and flow <= x[1])]
    front.append(label)


def brute_force_plan(
    queued: Sequence[Op],
    *,
    now: float,
    resident: str | None,
    busy_until: float,
    setup: SetupCost,
) -> Plan:
    """Every order that keeps each job's order, for tests on tiny instances."""
    best: Plan | None = None
    for perm in itertools.permutations(queued):
        seen: dict[str, int] = {}
        ok = True
        for op in perm:
            if op.seq < seen.get(op.job, -1):
                ok = False
                break
            seen[op.job] = op.seq
        if not ok:
            continue
        t, res = max(now, busy_until), resident
        entries = []
        for op in perm:
            cost = setup(op.job, res) if op.job != res else 0.0
            begin = max(t, op.arrival_s) + cost
            entries.append(PlannedOp(op, begin, begin + op.exec_s, cost))
            t, res = begin + op.exec_s, op.job
        plan = Plan(tuple(entries))
        if best is None or total_flow_s(plan) < total_flow_s(best) - 1e-12:
            best = plan
    assert best is not None
    return best
