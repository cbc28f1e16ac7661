"""PlexRL's job placement (§4.3.2): which node group a job's training deployment is pinned to,
and with what phase shift.

A job's demand on its group is a periodic trace S = {(a_i, d_i)} of execution segments in a
period T (its training operations: compute_log_prob, update_actor, sync_weight). Cold start: a
job without a profiled trace gets a node group of its own (no resident, booked over the whole
horizon) until one cycle is profiled; then `repack` places it again from its trace. Warm start:
the global range-min query prunes shifts for which too few nodes are free anywhere; then, on
each node group of the job's size, the trace is fitted into the group's free windows with a
micro-shift δ ∈ [0, αT] minimising Eq. 1 under Eq. 2.

With one rigid shift both terms of Eq. 1 grow with δ (the completion delay is δ/T and the start
shift δ/T), so its optimum is the smallest feasible δ. `fit` finds it exactly: the feasible
shifts of one segment occurrence form a union of intervals whose left ends are window starts
minus the occurrence's start, so their intersection over every occurrence (all periods up to
the horizon, as the commit books them all) starts at one of those points or at 0. `fit_scan`
is the paper's slot-by-slot scan, kept to check it.

Among groups where the trace fits, the cost of Eq. 1 decides, then predicted interference (how
much of the job's shifted segments sits within `margin` of a resident's busy time — the
resident's critical phase — rather than in its slack), then commensurate periods (§7.1: jobs
whose periods stand in a small integer ratio settle into a stable interleaving). A duty-ratio
bound (§7.2) rejects a group whose residents would then be busy more than that share of the
time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from loom.cluster.plexrl.timeline import Footprint, IntervalSet, Timeline
from loom.core.errors import ConfigError

__all__ = [
    "GroupOrder",
    "JobPlacement",
    "PlacementConfig",
    "PlexPlacement",
    "fit",
    "fit_scan",
    "group_windows",
    "optimal_assignment",
]

Interval = tuple[int, int]


def group_windows(free: Sequence[IntervalSet], lo: int, hi: int) -> list[Interval]:
    """Free windows of a node group over [lo, hi): the intersection of its nodes' free sets."""
    windows = [(max(s, lo), min(e, hi)) for s, e in free[0].overlapping(lo, hi)]
    for fs in free[1:]:
        other = [(max(s, lo), min(e, hi)) for s, e in fs.overlapping(lo, hi)]
        merged: list[Interval] = []
        i = j = 0
        while i < len(windows) and j < len(other):
            s, e = max(windows[i][0], other[j][0]), min(windows[i][1], other[j][1])
            if s < e:
                merged.append((s, e))
            if windows[i][1] < other[j][1]:
                i += 1
            else:
                j += 1
        windows = merged
    return windows


def _shifts_for(
    occ: Interval, windows: Sequence[Interval], max_shift: int, end: int | None
) -> list[Interval]:
    """Closed integer δ-intervals in [0, max_shift] that put `occ` inside one window. With a
    horizon `end`, the part of `occ` past it need not be free (nothing is booked there yet, and
    a commit books only up to it): a window reaching `end` runs on, and a shift that moves
    `occ` wholly past `end` is fine."""
    s, e = occ
    out = []
    for ws, we in windows:
        if end is not None and we >= end:
            we = e + max_shift  # open to the right
        lo, hi = max(0, ws - s), min(max_shift, we - e)
        if lo <= hi:
            out.append((lo, hi))
    if end is not None and end - s <= max_shift:
        beyond = (max(0, end - s), max_shift)
        if out and out[-1][1] >= beyond[0] - 1:
            out[-1] = (out[-1][0], max(out[-1][1], beyond[1]))
        else:
            out.append(beyond)
    return out


def _intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def fit(
    free: Sequence[IntervalSet],
    occurrences: Sequence[Interval],
    max_shift: int,
    allowed: list[Interval] | None = None,
    end: int | None = None,
) -> int | None:
    """The least δ in [0, max_shift] (within `allowed`, closed intervals, if given) that puts
    every occurrence [s + δ, e + δ) inside a free window of the group — up to the horizon
    `end`, if given; None if there is none."""
    feasible = allowed if allowed is not None else [(0, max_shift)]
    for s, e in occurrences:
        if not feasible:
            return None
        lo, hi = s + feasible[0][0], e + feasible[-1][1]
        if end is not None:
            hi = min(hi, end)
        windows = group_windows(free, lo, hi) if lo < hi else []
        feasible = _intersect(feasible, _shifts_for((s, e), windows, max_shift, end))
    return feasible[0][0] if feasible else None


def fit_scan(
    free: Sequence[IntervalSet],
    occurrences: Sequence[Interval],
    max_shift: int,
    end: int | None = None,
) -> int | None:
    """§4.3.2 read literally: try δ = 0, 1, 2, ... and check every shifted segment (up to the
    horizon `end`, if given)."""

    def fits(s: int, e: int) -> bool:
        if end is not None:
            if s >= end:
                return True
            e = min(e, end)
        return all(fs.covers(s, e) for fs in free)

    for delta in range(max_shift + 1):
        if all(fits(s + delta, e + delta) for s, e in occurrences):
            return delta
    return None


class GroupOrder(StrEnum):
    """How groups where a job fits are ranked (Fig. 8's sharing policies)."""

    SPREAD = "spread"  # PlexRL §4.3.2: least Eq. 1 cost, least interference, least loaded
    PACK = "pack"  # the most loaded group that takes the job (then the least cost)


@dataclass(frozen=True, kw_only=True)
class PlacementConfig:
    groups: tuple[tuple[int, ...], ...] = field(
        metadata={"help": "node groups (node ids of the timeline); a job takes a whole group"}
    )
    alpha: float = field(
        default=0.5, metadata={"help": "δ ∈ [0, αT] (§4.3.2 names α, not its value; assumed)"}
    )
    w1: float = field(default=1.0, metadata={"help": "Eq. 1: weight of the completion delay"})
    w2: float = field(default=1.0, metadata={"help": "Eq. 1: weight of the start shift"})
    duty_bound: float = field(
        default=0.9,
        metadata={
            "help": "§7.2: a group whose residents would be busy more than this share of the "
            "time takes no further job (the paper names the bound, not its value; assumed)"
        },
    )
    order: GroupOrder = field(
        default=GroupOrder.SPREAD, metadata={"help": "how feasible groups are ranked"}
    )
    margin_s: int = field(
        default=10,
        metadata={
            "help": "interference: a job's segment this close to a resident's busy time "
            "absorbs its jitter (assumed: 10 s, a few percent of Table 2's cycles)"
        },
    )

    def __post_init__(self) -> None:
        if not self.groups or any(not g for g in self.groups):
            raise ConfigError("placement needs at least one non-empty node group")
        nodes = [n for g in self.groups for n in g]
        if len(nodes) != len(set(nodes)):
            raise ConfigError("node groups must not share nodes")
        if not 0 <= self.alpha <= 1 or not 0 < self.duty_bound <= 1 or self.margin_s < 0:
            raise ConfigError("need 0 <= alpha <= 1, 0 < duty_bound <= 1, margin_s >= 0")


@dataclass(frozen=True)
class JobPlacement:
    """Where a job goes: its group, its shift and first period's start, and why."""

    job: str
    group: int
    nodes: tuple[int, ...]
    delta: int
    start: int  # absolute time its first period begins (now + δ)
    cost: float  # Eq. 1
    interference: float
    dedicated: bool  # cold start: the group is the job's alone until it is profiled
    pruned_fraction: float  # share of (group, δ) candidates the range-min check removed
    candidates: int  # groups where the trace fitted


@dataclass
class PlexPlacement:
    """Placement over a `Timeline`; commits what it decides."""

    timeline: Timeline
    config: PlacementConfig
    residents: dict[int, dict[str, Footprint]] = field(default_factory=dict)  # group -> jobs
    starts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for g in self.config.groups:
            for n in g:
                if not 0 <= n < self.timeline.nodes:
                    raise ConfigError(f"node {n} is not on the timeline ({self.timeline.nodes})")
        for i in range(len(self.config.groups)):
            self.residents.setdefault(i, {})

    def group_of(self, job: str) -> int | None:
        return next((g for g, jobs in self.residents.items() if job in jobs), None)

    # ---- cold start --------------------------------------------------------------------------
    def cold_start(self, job: str, nodes: int, duration: int | None = None) -> JobPlacement | None:
        """A group of `nodes` nodes with no resident, booked whole over the horizon (or for
        `duration` seconds)."""
        tl = self.timeline
        for g, members in enumerate(self.config.groups):
            if len(members) != nodes or self.residents[g]:
                continue
            whole = Footprint(((0, tl.horizon),), period=tl.horizon, nodes=nodes)
            until = None if duration is None else tl.now + duration
            tl.commit(job, whole, tl.now, members, until)
            self.residents[g][job] = whole
            self.starts[job] = tl.now
            return JobPlacement(job, g, members, 0, tl.now, 0.0, 0.0, True, 0.0, 1)
        return None

    # ---- warm start -------------------------------------------------------------------------
    def place(
        self, job: str, footprint: Footprint, duration: int | None = None
    ) -> JobPlacement | None:
        """Fit `job`'s trace on the best group and commit it — for `duration` seconds from its
        start if given, else over the horizon; None if no group takes it (the caller queues
        the job)."""
        return self._place(job, footprint, None, duration)

    def place_on(
        self, job: str, footprint: Footprint, group: int, duration: int | None = None
    ) -> JobPlacement | None:
        """Fit `job`'s trace on `group` only (for enumeration and for a caller's choice)."""
        return self._place(job, footprint, group, duration)

    def _place(
        self, job: str, footprint: Footprint, only: int | None, duration: int | None
    ) -> JobPlacement | None:
        tl, cfg = self.timeline, self.config
        if self.group_of(job) is not None:
            raise ConfigError(f"job {job!r} is placed already; release or repack it")
        period = footprint.period
        max_shift = int(cfg.alpha * period)
        end = tl.now + tl.horizon
        if period > tl.horizon:
            raise ConfigError(f"{job}: its period ({period} s) does not fit the horizon")
        last = end if duration is None else min(end, tl.now + duration)
        occ = list(footprint.occurrences(tl.now, last))
        allowed, pruned = self._prune(footprint, max_shift)
        sizes = [
            g
            for g, m in enumerate(cfg.groups)
            if len(m) == footprint.nodes and (only is None or g == only)
        ]
        best: tuple[tuple[float, ...], int, int, float] | None = None
        candidates = 0
        for g in sizes:
            if not allowed:
                break
            if self._duty(g) + _duty(footprint) > cfg.duty_bound + 1e-12:
                continue
            free = [tl.free[n] for n in cfg.groups[g]]
            delta = fit(free, occ, max_shift, allowed, end)
            if delta is None:
                continue
            candidates += 1
            cost = self.cost(footprint, delta)
            interference = self._interference(free, footprint, tl.now + delta)
            load = self._duty(g)
            rank: tuple[float, ...]
            if cfg.order == GroupOrder.PACK:
                rank = (-load, round(cost, 12), interference, float(g))
            else:
                rank = (
                    round(cost, 12),
                    interference,
                    load,
                    self._commensurate(g, period),
                    float(g),
                )
            if best is None or rank < best[0]:
                best = (rank, g, delta, interference)
        total = len(sizes) * (max_shift + 1)
        pruned_fraction = pruned * len(sizes) / total if total else 0.0
        if best is None:
            return None
        _, g, delta, interference = best
        members = cfg.groups[g]
        until = None if duration is None else tl.now + delta + duration
        tl.commit(job, footprint, tl.now + delta, members, until)
        self.residents[g][job] = footprint
        self.starts[job] = tl.now + delta
        return JobPlacement(
            job,
            g,
            members,
            delta,
            tl.now + delta,
            self.cost(footprint, delta),
            interference,
            False,
            pruned_fraction,
            candidates,
        )

    def repack(self, job: str, footprint: Footprint) -> JobPlacement | None:
        """A cold-started job's cycle is profiled: place it from its trace. Where nothing
        fits, it keeps its group as it was."""
        g = self.group_of(job)
        if g is None:
            raise ConfigError(f"job {job!r} is not placed")
        old = self.residents[g][job]
        self.release(job)
        placed = self.place(job, footprint)
        if placed is None:
            members = self.config.groups[g]
            self.timeline.commit(job, old, self.timeline.now, members)
            self.residents[g][job] = old
            self.starts[job] = self.timeline.now
        return placed

    def release(self, job: str) -> None:
        g = self.group_of(job)
        if g is None:
            raise ConfigError(f"job {job!r} is not placed")
        self.timeline.release(job)
        del self.residents[g][job]
        self.starts.pop(job, None)

    # ---- scoring ---------------------------------------------------------------------------
    def cost(self, footprint: Footprint, delta: int) -> float:
        """Eq. 1 for a rigid shift: the last segment ends δ later than it would."""
        t = footprint.period
        completion = delta / t  # t_end(δ) − T, over T
        return self.config.w1 * completion + self.config.w2 * delta / t

    def _prune(self, footprint: Footprint, max_shift: int) -> tuple[list[tuple[int, int]], int]:
        """Shifts (closed intervals) for which every segment of the first period finds
        `nodes` free nodes somewhere (the range-min gang check), and how many were pruned."""
        tl = self.timeline
        ok = []
        for delta in range(max_shift + 1):
            base = tl.now + delta
            if all(
                tl.min_free(base + a, base + a + d) >= footprint.nodes
                for a, d in footprint.segments
            ):
                ok.append(delta)
        pruned = max_shift + 1 - len(ok)
        allowed: list[tuple[int, int]] = []
        for d in ok:
            if allowed and allowed[-1][1] == d - 1:
                allowed[-1] = (allowed[-1][0], d)
            else:
                allowed.append((d, d))
        return allowed, pruned

    def _duty(self, g: int) -> float:
        """Busy share of group `g`'s time under its residents (1: a dedicated resident)."""
        total = 0.0
        for fp in self.residents[g].values():
            if fp.period >= self.timeline.horizon:
                return 1.0
            total += _duty(fp)
        return total

    def _interference(self, free: Sequence[IntervalSet], footprint: Footprint, start: int) -> float:
        """How close the first period's shifted segments sit to busy time, in [0, 1]: each
        edge of a segment closer than `margin_s` to the end of its free window (a resident's
        busy phase) counts the shortfall."""
        m = self.config.margin_s
        if m == 0:
            return 0.0
        tl = self.timeline
        near = 0
        for a, d in footprint.segments:
            s, e = start + a, start + a + d
            for fs in free:
                w = fs.window(s)
                assert w is not None and e <= w[1], "a fitted segment lies in a free window"
                if w[0] > tl.now:
                    near += max(0, m - (s - w[0]))
                if w[1] < tl.now + tl.horizon:
                    near += max(0, m - (w[1] - e))
        return near / (2 * m * len(footprint.segments) * len(free))

    def _commensurate(self, g: int, period: int) -> float:
        """How far `period` is from a small-integer ratio with each resident's (§7.1)."""
        worst = 0.0
        for fp in self.residents[g].values():
            if fp.period == self.timeline.horizon:
                continue
            ratio = Fraction(period, fp.period).limit_denominator(4)
            worst = max(worst, abs(period / fp.period - float(ratio)))
        return worst


def _duty(fp: Footprint) -> float:
    return sum(d for _, d in fp.segments) / fp.period


def optimal_assignment(
    nodes: int,
    horizon: int,
    config: PlacementConfig,
    jobs: Sequence[tuple[str, Footprint]],
) -> tuple[int, float, dict[str, int]]:
    """The best assignment of `jobs` (≤ 6, in their order) to node groups by enumeration: every
    job either goes to a group — fitted there at its least feasible shift after the jobs before
    it — or stays out. Best: most jobs placed, then least total Eq. 1 cost. Returns (placed,
    cost, job -> group). For checking the greedy placement on small instances."""
    if len(jobs) > 6 or len(config.groups) > 3:
        raise ConfigError("optimal_assignment is for <= 6 jobs and <= 3 groups")
    import itertools

    best: tuple[int, float, dict[str, int]] = (0, 0.0, {})
    choices = [-1, *range(len(config.groups))]
    for assign in itertools.product(choices, repeat=len(jobs)):
        tl = Timeline(nodes=nodes, horizon=horizon)
        pl = PlexPlacement(tl, config)
        placed, cost, where = 0, 0.0, {}
        for (job, fp), g in zip(jobs, assign, strict=True):
            if g < 0:
                continue
            got = pl.place_on(job, fp, g)
            if got is None:
                break
            placed += 1
            cost += got.cost
            where[job] = g
        else:
            if (placed, -cost) > (best[0], -best[1]):
                best = (placed, cost, where)
    return best
