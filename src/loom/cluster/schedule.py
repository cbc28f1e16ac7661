"""Executes a group's round-robin meta-iterations (§4.3, §5.1): FIFO queues per node, warm
starts, and optional long-tail migration. Pure: durations are passed in, time is simulated.

Rollout phases wait in one FIFO queue per rollout node (a ticket taken when the job becomes
ready, in round-robin order at the start); a job starts when it heads the queue of every node
it is pinned to. Training phases use the whole training pool in the round-robin order of the
meta-iteration (§4.3: Train_A -> Train_B). With migration, when a rollout's head (the first 80%
of responses) finishes, its stragglers are consolidated onto `tail_gpu_frac` of its GPUs and the
next queued rollout starts on the rest at reduced rate.

NOTE: the training order is fixed, not first-come: with migration a short rollout can finish
before the straggler tail of the rollout ahead of it, and serving it first would let its long
training delay the other job's (a 12% longer period than the worst-case plan in §7.5 traces).
With fixed orders on every resource, phase end times only grow with phase durations, so the
worst-case plan that admission checks bounds every actual period.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from loom.cluster.group import GroupLayout
from loom.core.jobs import PhaseKind

__all__ = ["GroupSchedule", "PhaseRun", "PhaseTimes", "run_round_robin", "worst_case_times"]

MIN_RATE = 0.05


@dataclass(frozen=True, slots=True)
class PhaseTimes:
    """One iteration of one job: rollout head (capacity-bound), tail (latency-bound) and the
    training-pool occupancy (training plus synchronization), in seconds."""

    roll_head_s: float
    roll_tail_s: float
    train_s: float


DurationFn = Callable[[int, int], PhaseTimes]  # (member index, iteration) -> times


def worst_case_times(layout: GroupLayout, migration_s: float = 0.0) -> DurationFn:
    """Every response at the maximum length: the admission-time plan (§4.2)."""
    times = [
        PhaseTimes(
            roll_head_s=m.job.roll_s + migration_s, roll_tail_s=0.0, train_s=m.job.train_total_s
        )
        for m in layout.members
    ]
    return lambda i, _k: times[i]


@dataclass(frozen=True, slots=True)
class PhaseRun:
    """One executed phase, for Gantt charts and invariant checks. `nodes` are rollout-node
    indices (a rollout) or training-node indices (a training phase); `tail_start` is when the
    stragglers were consolidated (None: no migration)."""

    job_id: str
    kind: PhaseKind
    iteration: int
    start: float
    end: float
    nodes: tuple[int, ...]
    head_end: float
    tail_start: float | None = None


@dataclass(frozen=True)
class GroupSchedule:
    runs: tuple[PhaseRun, ...]
    iteration_ends: tuple[tuple[float, ...], ...]  # per member, end time of each iteration

    def period_s(self, member: int, window: int | None = None) -> float:
        """Mean iteration time over the last `window` iterations (all, if None)."""
        ends = self.iteration_ends[member]
        if window is None or window >= len(ends):
            return ends[-1] / len(ends)
        return (ends[-1] - ends[-1 - window]) / window

    @property
    def makespan_s(self) -> float:
        return max((e[-1] for e in self.iteration_ends if e), default=0.0)


class _Node:
    __slots__ = ("free_at", "last", "tails")

    def __init__(self) -> None:
        self.free_at = 0.0
        self.last = -1
        self.tails: list[float] = []  # end times of straggler tails running here


def _head_end(start: float, work: float, nodes: list[_Node], frac: float) -> float:
    """When `work` full-rate seconds finish on `nodes`, given the tails already running there."""
    ends = sorted({e for n in nodes for e in n.tails if e > start})
    t, left = start, work
    for e in [*ends, float("inf")]:
        active = max(sum(1 for x in n.tails if x > t) for n in nodes)
        rate = max(MIN_RATE, 1.0 - frac * active)
        if left <= rate * (e - t):
            return t + left / rate
        left -= rate * (e - t)
        t = e
    raise AssertionError("unreachable: the last segment is unbounded")


def run_round_robin(
    layout: GroupLayout,
    durations: DurationFn,
    iterations: int | tuple[int, ...],
    *,
    warm_s: tuple[float, ...] | None = None,
    migration: bool = False,
    tail_gpu_frac: float = 0.25,
    migration_s: float = 0.0,
    record: bool = True,
) -> GroupSchedule:
    """Run each member for its iterations under the round-robin FIFO discipline."""
    members = layout.members
    n = len(members)
    its = (iterations,) * n if isinstance(iterations, int) else iterations
    assert len(its) == n, "one iteration count per member"
    warm = warm_s if warm_s is not None else tuple(m.job.warm_s for m in members)
    shared = n > 1
    nodes = [_Node() for _ in range(layout.rollout_nodes)]
    train = _Node()
    runs: list[PhaseRun] = []
    ends: list[list[float]] = [[] for _ in range(n)]
    done = [0] * n
    roll_wait: list[tuple[int, int]] = [(i, i) for i in range(n) if its[i] > 0]  # (ticket, m)
    train_ready: set[int] = set()
    turn = 0  # member whose training is next in the round-robin order
    ticket = n
    events: list[tuple[float, int, int, int]] = []  # (time, seq, kind 0=roll end 1=train end, m)
    seq = 0
    now = 0.0
    all_train = tuple(range(layout.train_nodes))

    def dispatch() -> None:
        nonlocal seq, turn
        blocked: set[int] = set()
        still: list[tuple[int, int]] = []
        for tk, m in roll_wait:
            mine = members[m].nodes
            ns = [nodes[i] for i in mine]
            if blocked.intersection(mine) or any(x.free_at > now for x in ns):
                blocked.update(mine)
                still.append((tk, m))
                continue
            times = durations(m, done[m])
            load = warm[m] if shared and any(x.last != m for x in ns) else 0.0
            head_end = _head_end(now + load, times.roll_head_s, ns, tail_gpu_frac)
            if migration and shared and times.roll_tail_s > 0:
                end = head_end + migration_s + times.roll_tail_s
                for x in ns:
                    x.free_at = head_end
                    x.tails.append(end)
                tail_start: float | None = head_end
            else:
                end = head_end + times.roll_tail_s
                for x in ns:
                    x.free_at = end
                tail_start = None
            for x in ns:
                x.last = m
                x.tails = [e for e in x.tails if e > now]
            if record:
                runs.append(
                    PhaseRun(
                        job_id=members[m].job.job_id,
                        kind=PhaseKind.ROLLOUT,
                        iteration=done[m],
                        start=now,
                        end=end,
                        nodes=mine,
                        head_end=head_end,
                        tail_start=tail_start,
                    )
                )
            heapq.heappush(events, (end, seq, 0, m))
            seq += 1
            blocked.update(mine)
        roll_wait[:] = still
        if train.free_at <= now and _next_turn() in train_ready:
            m = turn
            train_ready.discard(m)
            times = durations(m, done[m])
            load = warm[m] if shared and train.last != m else 0.0
            end = now + load + times.train_s
            train.free_at, train.last = end, m
            if record:
                runs.append(
                    PhaseRun(
                        job_id=members[m].job.job_id,
                        kind=PhaseKind.TRAIN,
                        iteration=done[m],
                        start=now,
                        end=end,
                        nodes=all_train,
                        head_end=end,
                    )
                )
            heapq.heappush(events, (end, seq, 1, m))
            seq += 1
            turn = (m + 1) % n

    def _next_turn() -> int:
        """Skip members that have run all their iterations."""
        nonlocal turn
        for _ in range(n):
            if done[turn] < its[turn]:
                return turn
            turn = (turn + 1) % n
        return -1

    def finish(kind: int, m: int) -> None:
        nonlocal ticket
        if kind == 0:
            train_ready.add(m)
        elif kind == 1:
            ends[m].append(now)
            done[m] += 1
            if done[m] < its[m]:
                roll_wait.append((ticket, m))
                ticket += 1

    dispatch()
    _wake_for_heads(nodes, roll_wait, events, now)
    while events:
        now, _s, kind, m = heapq.heappop(events)
        finish(kind, m)
        while events and events[0][0] == now:
            _t, _s, kind, m = heapq.heappop(events)
            finish(kind, m)
        dispatch()
        # NOTE: a head that ends early (migration) frees its nodes without an event of its own.
        _wake_for_heads(nodes, roll_wait, events, now)
    return GroupSchedule(runs=tuple(runs), iteration_ends=tuple(tuple(e) for e in ends))


def _wake_for_heads(
    nodes: list[_Node],
    roll_wait: list[tuple[int, int]],
    events: list[tuple[float, int, int, int]],
    now: float,
) -> None:
    """Add a no-op wake-up at the next head end so waiting rollouts start when a head frees."""
    if not roll_wait:
        return
    nxt = min((x.free_at for x in nodes if x.free_at > now), default=None)
    if nxt is not None and not any(e[0] == nxt for e in events):
        heapq.heappush(events, (nxt, -1, 2, -1))
