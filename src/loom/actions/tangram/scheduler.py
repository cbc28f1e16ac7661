"""ARL-Tangram's elastic scheduler (§4.2, Algorithm 1, Appendix A).

Each pass takes the longest FCFS prefix of the queue that fits every manager at minimum units
(a prefix per scheduling domain: one pass per CPU node, per GPU pool, per API), splits it by
key resource and domain, gives unknown and non-scalable actions their minimum, and for
scalable ones greedily evicts the last candidate while that lowers the approximated objective:
the exact ACTs of the candidates under DPArrange plus the remaining queue's ACTs estimated on
the completion heap (with `depth` allocation choices for its first action).

With `lookahead_arrivals` (beyond Algorithm 2, off by default) the estimate also counts the
actions expected to arrive in the domain while the decision's units are held; see
`ElasticScheduler._phantoms`.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter

from loom.actions.managers.base import Grant, Ledger, ResourceManager
from loom.actions.policy import ACTION_POLICIES, ActionPolicyKind, Start
from loom.actions.tangram.arrange import Arrangement, UnitDurations
from loom.core.actions import ActionSpec
from loom.core.errors import ConfigError

__all__ = ["ElasticScheduler", "TangramConfig"]


@dataclass(frozen=True, kw_only=True)
class TangramConfig:
    depth: int = field(
        default=2,
        metadata={"help": "allocation choices tried for the first remaining action (paper: 2)"},
    )
    lookahead: int = field(
        default=128, metadata={"help": "remaining queued actions the objective estimates"}
    )
    fixed_units: int | None = field(
        default=None,
        metadata={"help": "give every elastic action this many units (the dop-k baselines)"},
    )
    lookahead_arrivals: bool = field(
        default=False,
        metadata={
            "help": "also estimate the actions expected to arrive in a domain within the "
            "decision's horizon (beyond Algorithm 2; see the scheduler's module notes)"
        },
    )
    backfill_s: float | None = field(
        default=None,
        metadata={
            "help": "an action that does not fit lets those behind it that fit start, until "
            "it has waited this long (then FCFS again, so it cannot starve); None: strict "
            "FCFS, as the paper schedules (the simulator's reproductions)"
        },
    )

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ConfigError(f"depth must be >= 1, got {self.depth}")
        if self.lookahead < 0:
            raise ConfigError(f"lookahead must be >= 0, got {self.lookahead}")
        if self.fixed_units is not None and self.fixed_units < 1:
            raise ConfigError(f"fixed_units must be >= 1, got {self.fixed_units}")
        if self.backfill_s is not None and not self.backfill_s >= 0:
            raise ConfigError(f"backfill_s must be >= 0, got {self.backfill_s}")


@dataclass(slots=True)
class _Running:
    action: ActionSpec
    grants: tuple[Grant, ...]
    group: tuple[str, str]  # (key manager, domain)
    units: int  # of the key resource, freed at `end_s`
    end_s: float  # expected


@dataclass(slots=True, eq=False)
class _Queued:
    """A queued action and what the scheduler derives from it once, at submission."""

    action: ActionSpec
    km: ResourceManager  # the manager of its key resource
    others: tuple[tuple[ResourceManager, int], ...]  # other managers it touches, least units
    durs: dict[int, float]  # getDur(m) for every feasible m of the key resource, ascending
    units: int  # what a pass first gives it: its least (dop-k: the most up to k)
    top: int  # its most
    scalable: bool  # DPArrange splits units among such candidates
    head: list[tuple[int, float]]  # (units, duration) at its first `depth` counts (one if not
    # scalable): the allocation choices ESTIMATE tries when it is the first remaining action
    table: UnitDurations | None = None  # `durs` checked for DPArrange (scalable ones)
    submit_s: float = 0.0  # when it arrived


@dataclass(slots=True, frozen=True)
class _Arrival:
    """A started action as the arrival lookahead remembers it (one per start, per domain)."""

    submit_s: float
    held_s: float  # its expected duration at the units it got
    least: int  # the units a pass gives it first
    most: int  # the most a pass may give it (its least when not scalable)
    keys: list[int]  # its feasible counts, ascending
    durs: dict[int, float]


# An expected arrival: (offset from now, least units, most units, feasible counts, durations).
_Phantom = tuple[float, int, int, list[int], dict[int, float]]


@dataclass(slots=True, eq=False)
class _Candidate:
    q: _Queued
    order: int
    domain: str  # of the key manager
    other_domains: tuple[str, ...]  # of `q.others`, in their order
    units: int


_BY_ORDER, _BY_UNITS = attrgetter("order"), attrgetter("units")


class ElasticScheduler:
    """Algorithm 1 over a set of resource managers (each resource key owned by exactly one)."""

    def __init__(
        self, managers: Sequence[ResourceManager], config: TangramConfig | None = None
    ) -> None:
        if not managers:
            raise ConfigError("the scheduler needs at least one resource manager")
        names = [m.name for m in managers]
        if len(set(names)) != len(names):
            raise ConfigError(f"duplicate manager names: {names}")
        self.managers = list(managers)
        self._by_name = {m.name: m for m in self.managers}
        self.config = config or TangramConfig()
        self._queue: dict[str, _Queued] = {}
        self._running: dict[str, _Running] = {}
        self._recent: dict[tuple[str, str], deque[_Arrival]] = {}  # lookahead_arrivals only
        self.decisions = 0

    # -- ActionPolicy ----------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    def queued_ids(self) -> list[str]:
        return list(self._queue)

    def submit(self, action: ActionSpec, now: float) -> None:
        if action.action_id in self._queue or action.action_id in self._running:
            raise ConfigError(f"action id {action.action_id!r} is already queued or running")
        mgrs = self._managers_of(action)
        for m in mgrs:
            m.validate(action)
        km, others = mgrs[0], []
        for m in mgrs[1:]:
            opts = m.options(action)
            if not opts:
                raise ConfigError(f"action {action.action_id!r} can take no units of {m.name}")
            others.append((m, opts[0]))
        # getDur(m) for every feasible m, computed once (the formulation step); ascending, so
        # the first key is the minimum.
        durs = {u: action.duration_s(u) for u in sorted(km.options(action))}
        if not durs:
            raise ConfigError(f"action {action.action_id!r} can take no units of {km.name}")
        first, k = next(iter(durs)), self.config.fixed_units
        if k is not None and action.elastic:
            first = max((u for u in durs if u <= k), default=first)
        scalable = (
            k is None
            and action.elastic
            and action.elasticity is not None
            and action.t_ori_s > 0
            and len(durs) > 1
        )
        head = list(islice(durs.items(), self.config.depth if scalable else 1))
        top = next(reversed(durs))
        q = _Queued(action, km, tuple(others), durs, first, top, scalable, head, submit_s=now)
        if scalable:  # DPArrange's view of it, checked now rather than on every pass
            with suppress(ConfigError):  # a bad duration is reported by the pass, as before
                q.table = UnitDurations(durs)
        self._queue[action.action_id] = q

    def cancel(self, action_id: str) -> bool:
        return self._queue.pop(action_id, None) is not None

    def finish(self, action_id: str, now: float) -> None:
        run = self._running.pop(action_id, None)
        if run is None:
            raise ConfigError(f"action {action_id!r} is not running")
        for g in run.grants:
            self._by_name[g.manager].release(run.action, g, now)

    def end_trajectory(self, trajectory_id: str, now: float) -> None:
        for m in self.managers:
            m.end_trajectory(trajectory_id)

    def next_wakeup(self, now: float) -> float | None:
        if not self._queue:
            return None
        times = [t for m in self.managers if (t := m.next_change_s(now)) is not None]
        return min(times) if times else None

    def schedule(self, now: float) -> list[Start]:
        if not self._queue:
            return []
        self.decisions += 1
        return self._start(self._decide(now), now)

    def plan(self, now: float) -> list[tuple[str, int, str]]:
        """What a pass would start now, without starting it: (action id, units of its key
        resource, key domain) per action; the decision of `schedule` before allocation."""
        if not self._queue:
            return []
        return [(c.q.action.action_id, c.units, c.domain) for c in self._decide(now)]

    def _decide(self, now: float) -> list[_Candidate]:
        ledgers = {m.name: m.ledger(now) for m in self.managers}
        cands = self._candidates(ledgers, now)
        selected: list[_Candidate] = []
        groups: dict[tuple[str, str], list[_Candidate]] = {}
        for c in cands:
            key = (c.q.km.name, c.domain)
            members = groups.get(key)
            if members is None:
                groups[key] = [c]
            else:
                members.append(c)
        for (mname, domain), members in groups.items():
            selected += self._elastic(mname, domain, members, ledgers[mname], cands, now)
        return selected

    # -- phase 1: FCFS candidates at minimum units -----------------------------------------
    def _candidates(self, ledgers: Mapping[str, Ledger], now: float) -> list[_Candidate]:
        backfill = self.config.backfill_s
        out: list[_Candidate] = []
        blocked: set[tuple[str, str | None]] = set()
        for order, q in enumerate(self._queue.values()):
            a, km = q.action, q.km
            lane = (km.name, km.pinned_domain(a))
            if lane in blocked:
                continue
            key_ledger = ledgers[km.name]
            d = key_ledger.take(a, q.units)
            if d is not None and not q.others:
                out.append(_Candidate(q, order, d, (), q.units))
                continue
            if d is not None:
                taken: list[tuple[Ledger, str, int]] = []
                for m, u in q.others:
                    od = ledgers[m.name].take(a, u)
                    if od is None:
                        break
                    taken.append((ledgers[m.name], od, u))
                else:
                    out.append(_Candidate(q, order, d, tuple(t[1] for t in taken), q.units))
                    continue
                for ledger, od, u in reversed(taken):
                    ledger.give(a, od, u, full=True)
                key_ledger.give(a, d, q.units, full=True)
            if backfill is None or now - q.submit_s >= backfill:
                blocked.add(lane)  # FCFS: nothing behind it in its lane jumps ahead
        return out

    # -- phase 2: greedy eviction per (key resource, domain) -------------------------------
    def _elastic(
        self,
        mname: str,
        domain: str,
        members: list[_Candidate],
        ledger: Ledger,
        cands: list[_Candidate],
        now: float,
    ) -> list[_Candidate]:
        km = self._by_name[mname]
        scal = [c for c in members if c.q.scalable]
        if not scal:  # Line 5-6: unknown or zero elasticity: minimum units, all selected
            return members
        fixed = [c for c in members if not c.q.scalable]
        for c in scal:  # their minimum units return to the pool the DP splits
            ledger.give(c.q.action, domain, c.units)
        cap = ledger.free_units(domain)
        group = (mname, domain)
        # The completion heap holds one entry per unit of the key resource (when it frees,
        # relative to now), as ESTIMATE gives each remaining action its least units from it:
        # a running action frees all its units at its expected end, and so does a candidate
        # that keeps its minimum (unknown elasticity); a free unit is free now. NOTE: one
        # entry per action would let a completion that frees 32 cores start one queued
        # single-core action only, overstating the queue's wait behind wide allocations.
        held: list[float] = []
        for r in self._running.values():
            if r.group == group:
                held += [max(r.end_s - now, 0.0)] * r.units
        for c in fixed:
            held += [c.q.durs[c.units]] * c.units
        remaining: list[_Queued] = []
        if self.config.lookahead:
            taken = {c.q.action.action_id for c in cands}
            for aid, q in self._queue.items():
                if aid not in taken and q.km is km and km.pinned_domain(q.action) in (None, domain):
                    remaining.append(q)
                    if len(remaining) == self.config.lookahead:
                        break

        # (least units, duration at them) per action: `head` starts at them.
        base = [q.head[0] for q in remaining]
        scal_min = [c.q.head[0] for c in scal]
        scal_durs = [c.q.durs for c in scal]
        arrange = ledger.prefixes(
            domain,
            [
                c.q.table if c.q.table is not None and c.q.top <= cap else _options(c.q, cap)
                for c in scal
            ],
        )

        phantoms = self._phantoms(group, now) if self.config.lookahead_arrivals else []

        def objective(k: int, limit: int | None = None) -> tuple[float, Arrangement | None]:
            arr = arrange(k) if limit is None else capped(limit)(k)
            if arr is None:
                return math.inf, None
            heap = held + [0.0] * (cap - sum(arr.units))
            for d, u in zip(scal_durs, arr.units, strict=False):
                heap += [d[u]] * u
            rest = scal_min[k:] + base
            head = (scal[k].q if k < len(scal) else remaining[0]).head if rest else []
            return arr.total + _estimate(heap, head, rest, phantoms, limit), arr

        def capped(limit: int) -> Callable[[int], Arrangement | None]:
            # The first k only (those kept): the rest may not fit under the limit at all.
            return ledger.prefixes(domain, [_options(c.q, min(cap, limit)) for c in scal[:k]])

        obj, best = objective(len(scal))
        k = len(scal)
        # Line 8-11: evict the last while the objective falls, t = 1..|C_j|: every candidate
        # may wait for units a completion frees. NOTE: when nothing in this domain runs or
        # starts, at least one candidate stays, as no completion would trigger the next pass
        # (ESTIMATE starts the evicted at once on the free units, which no pass would do).
        last = len(scal) if held else len(scal) - 1
        for t in range(1, last + 1):
            new_obj, arr = objective(len(scal) - t)
            if new_obj >= obj:
                break
            obj, best, k = new_obj, arr, len(scal) - t
        assert best is not None, "candidates fit at minimum units, so DPArrange is feasible"
        if phantoms and k:
            # Lookahead only: DPArrange gives the candidates every free unit, which the
            # expected arrivals would then lack. Halve the most units any candidate (and, in
            # the estimate, any expected arrival) may take while the objective falls: a lone
            # arrival's DoP traded against the ACT of those behind it.
            floor = max(c.q.units for c in scal[:k])
            limit = max(best.units) // 2
            while limit >= floor:
                new_obj, arr = objective(k, limit)
                if new_obj >= obj or arr is None:
                    break
                obj, best = new_obj, arr
                limit //= 2
        for c, u in zip(scal[:k], best.units, strict=True):
            c.units = u
        return fixed + scal[:k]

    def _phantoms(self, group: tuple[str, str], now: float) -> list[_Phantom]:
        """The actions expected to arrive in `group` within the decision's horizon, at their
        expected times (offsets from now). The horizon is the mean expected duration of the
        domain's recent starts: how long a decision's units stay held, so the span over which
        it delays later arrivals. The next horizon is expected to bring what the last one did
        (the arrivals of the actions since started here), at their mean rate: each of those,
        oldest first, recurs at an evenly spaced expected time. NOTE: a rate over a shorter
        span (since the first arrival, while the history is young) extrapolates from a few
        arrivals and did worse on §6.4's trace (dop4/tangram 2.77 -> 2.67 on one node)."""
        rec = self._recent.get(group)
        if not rec:
            return []
        horizon = sum(a.held_s for a in rec) / len(rec)
        if not horizon > 0.0:
            return []
        seen = [a for a in rec if a.submit_s > now - horizon]
        if not seen:
            return []
        step = horizon / len(seen)
        return [(i * step, a.least, a.most, a.keys, a.durs) for i, a in enumerate(seen, 1)]

    def _remember(self, q: _Queued, group: tuple[str, str], units: int) -> None:
        rec = self._recent.get(group)
        if rec is None:
            rec = self._recent[group] = deque(maxlen=self.config.lookahead)
        if q.scalable:  # a pass may give it any of its counts
            most, keys, durs = q.top, list(q.durs), q.durs
        else:  # a pass gives it its first count only
            most, keys, durs = q.units, [q.units], {q.units: q.durs[q.units]}
        rec.append(_Arrival(q.submit_s, q.durs[units], q.units, most, keys, durs))

    # -- phase 3: concrete allocation ------------------------------------------------------
    def _start(self, selected: list[_Candidate], now: float) -> list[Start]:
        out: list[Start] = []
        # Largest first within a domain: exact for power-of-two chunks (see GPU manager).
        # Two stable sorts with C-level keys: by order, then by units descending (`reverse`
        # keeps equal keys in order), i.e. by (-units, order).
        ordered = sorted(selected, key=_BY_ORDER)
        ordered.sort(key=_BY_UNITS, reverse=True)
        for c in ordered:
            q = c.q
            a, km, units, domain = q.action, q.km, c.units, c.domain
            grant = km.allocate(a, units, domain, now)
            if q.others:
                grants: tuple[Grant, ...] = (
                    grant,
                    *(
                        m.allocate(a, u, d, now)
                        for (m, u), d in zip(q.others, c.other_domains, strict=True)
                    ),
                )
                overhead = max(g.overhead_s for g in grants)
            else:
                grants, overhead = (grant,), grant.overhead_s
            expected = q.durs[units]
            del self._queue[a.action_id]
            if self.config.lookahead_arrivals and self.config.lookahead:
                self._remember(q, (km.name, domain), units)
            self._running[a.action_id] = _Running(
                a, grants, (km.name, domain), units, now + overhead + expected
            )
            out.append(
                Start(
                    action=a,
                    units=units,
                    domain=domain,
                    grants=grants,
                    overhead_s=overhead,
                    expected_s=expected,
                )
            )
        return out

    # -- helpers ---------------------------------------------------------------------------
    def _owner(self, key: str) -> ResourceManager:
        for m in self.managers:
            if m.owns(key):
                return m
        raise ConfigError(f"no resource manager handles resource {key!r}")

    def _key_manager(self, a: ActionSpec) -> ResourceManager:
        if a.key_resource is not None:
            return self._owner(a.key_resource)
        if not a.demand:
            raise ConfigError(f"action {a.action_id!r} demands no resource")
        return self._owner(next(iter(a.demand)))

    def _managers_of(self, a: ActionSpec) -> list[ResourceManager]:
        km = self._key_manager(a)
        others = {id(m): m for k in a.demand if (m := self._owner(k)) is not km}
        return [km, *others.values()]


@ACTION_POLICIES.register(ActionPolicyKind.TANGRAM)
def tangram(
    managers: Sequence[ResourceManager], depth: int = 2, backfill_s: float | None = None
) -> ElasticScheduler:
    return ElasticScheduler(managers, TangramConfig(depth=depth, backfill_s=backfill_s))


@ACTION_POLICIES.register(ActionPolicyKind.TANGRAM_LOOKAHEAD)
def tangram_lookahead(
    managers: Sequence[ResourceManager], depth: int = 2, backfill_s: float | None = None
) -> ElasticScheduler:
    cfg = TangramConfig(depth=depth, lookahead_arrivals=True, backfill_s=backfill_s)
    return ElasticScheduler(managers, cfg)


@ACTION_POLICIES.register(ActionPolicyKind.DOP4)
def dop4(managers: Sequence[ResourceManager], backfill_s: float | None = None) -> ElasticScheduler:
    return ElasticScheduler(managers, TangramConfig(fixed_units=4, backfill_s=backfill_s))


@ACTION_POLICIES.register(ActionPolicyKind.DOP16)
def dop16(managers: Sequence[ResourceManager], backfill_s: float | None = None) -> ElasticScheduler:
    return ElasticScheduler(managers, TangramConfig(fixed_units=16, backfill_s=backfill_s))


def _options(q: _Queued, cap: int) -> Mapping[int, float]:
    """The action's durations at counts up to `cap`, as DPArrange takes them: its checked
    table (cut when `cap` is below its most), or a plain mapping when the check failed, so
    that DPArrange reports the bad option as it would for any input."""
    cut = None if q.table is None else q.table.at_most(cap)
    return {u: d for u, d in q.durs.items() if u <= cap} if cut is None else cut


def _estimate(
    heap: list[float],
    head: list[tuple[int, float]],
    actions: list[tuple[int, float]],
    phantoms: Sequence[_Phantom] = (),
    limit: int | None = None,
) -> float:
    """Algorithm 2's ESTIMATE over a completion heap of units (when each frees): each remaining
    action, given as (least units, duration at them), takes the earliest-freed units it needs,
    starts when the last of them frees and frees them all at its end; the first one tries each
    of its `depth` allocations (`head`, as (units, duration)) and the least sum counts.

    Then (lookahead only) each expected arrival, in order of its offset t from now: it takes
    the units free by t, up to its most (and `limit`), as a pass would give a lone arrival;
    waits for its least when fewer are free; and counts its ACT from t."""
    if not actions and not phantoms:
        return 0.0
    rest = actions[1:]
    wants = [max(p[1], p[2] if limit is None else min(p[2], limit)) for p in phantoms]
    # Only the `pops` earliest entries can ever be taken; the rest never reach the top.
    pops = sum(u for u, _ in rest) + max((u for u, _ in head), default=0) + sum(wants)
    base = sorted(heap)[:pops]  # a sorted list is a valid heap
    best = math.inf
    firsts: list[tuple[int, float] | None] = list(head) or [None]  # no queue: arrivals only
    for first in firsts:
        h = list(base)
        total = 0.0
        for units, dur in () if first is None else (first, *rest):
            start = 0.0
            if units > len(h):  # the domain never holds that many units at once
                total = math.inf
                break
            for _ in range(units - 1):
                start = heapq.heappop(h)
            if h:
                # The last unit it waits for frees at h[0]; replacing the least in place pops
                # it and pushes this action's end at once.
                start = h[0]
                end = start + dur
                heapq.heapreplace(h, end)
            else:
                end = start + dur
                heapq.heappush(h, end)
            for _ in range(units - 1):
                heapq.heappush(h, end)
            total += end
        if phantoms and total < math.inf:
            total += _arrivals(h, phantoms, wants)
        best = min(best, total)
    return best


def _arrivals(h: list[float], phantoms: Sequence[_Phantom], wants: list[int]) -> float:
    """The expected arrivals' ACTs on the completion heap `h` (consumed); see `_estimate`.
    Units that free at the same time are one [time, count] run here, so an arrival taking 32
    units costs a few heap operations rather than 64."""
    h.sort()
    runs: list[list[float]] = []  # sorted, so a valid heap
    for x in h:
        if runs and runs[-1][0] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    size, total = len(h), 0.0
    for (t, least, _, keys, durs), want in zip(phantoms, wants, strict=True):
        if least > size:
            return math.inf
        taken: list[tuple[float, int]] = []
        got = 0
        # The units free by its arrival, up to `want` (the domain may hold fewer); then, if
        # fewer than its least, the earliest to free after it.
        while got < least or (got < want and runs and runs[0][0] <= t):
            r = runs[0]
            n = min(int(r[1]), (want if r[0] <= t else least) - got)
            if n == r[1]:
                heapq.heappop(runs)
            else:
                r[1] -= n  # its time is unchanged, so the heap stays valid
            taken.append((r[0], n))
            got += n
        units = keys[bisect_right(keys, got) - 1]
        while got > units:  # an infeasible count: the latest-freed go back
            at, n = taken.pop()
            back = min(n, got - units)
            heapq.heappush(runs, [at, back])
            if n > back:
                taken.append((at, n - back))
            got -= back
        start = max(t, taken[-1][0])
        end = start + durs[units]
        heapq.heappush(runs, [end, units])
        total += end - t
    return total
