"""ARL-Tangram's elastic scheduler (§4.2, Algorithm 1, Appendix A).

Each pass takes the longest FCFS prefix of the queue that fits every manager at minimum units
(a prefix per scheduling domain: one pass per CPU node, per GPU pool, per API), splits it by
key resource and domain, gives unknown and non-scalable actions their minimum, and for
scalable ones greedily evicts the last candidate while that lowers the approximated objective:
the exact ACTs of the candidates under DPArrange plus the remaining queue's ACTs estimated on
the completion heap (with `depth` allocation choices for its first action).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

from loom.actions.managers.base import Grant, Ledger, ResourceManager
from loom.actions.policy import ACTION_POLICIES, ActionPolicyKind, Start
from loom.actions.tangram.arrange import Arrangement
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

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ConfigError(f"depth must be >= 1, got {self.depth}")
        if self.lookahead < 0:
            raise ConfigError(f"lookahead must be >= 0, got {self.lookahead}")
        if self.fixed_units is not None and self.fixed_units < 1:
            raise ConfigError(f"fixed_units must be >= 1, got {self.fixed_units}")


@dataclass
class _Running:
    action: ActionSpec
    grants: tuple[Grant, ...]
    group: tuple[str, str]  # (key manager, domain)
    end_s: float  # expected


@dataclass
class _Candidate:
    action: ActionSpec
    order: int
    domains: dict[str, str]  # manager -> domain
    units: int


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
        self.config = config or TangramConfig()
        self._queue: dict[str, ActionSpec] = {}
        self._running: dict[str, _Running] = {}
        # getDur(m) for every feasible m, computed once at submission (the formulation step).
        self._durs: dict[str, dict[int, float]] = {}
        # Each queued action's managers, key manager first (fixed at submission).
        self._mgrs: dict[str, list[ResourceManager]] = {}
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
        for m in self._managers_of(action):
            m.validate(action)
        km = self._key_manager(action)
        # Ascending unit counts: the first key is the minimum.
        units = sorted(km.options(action))
        self._durs[action.action_id] = {u: action.duration_s(u) for u in units}
        self._mgrs[action.action_id] = self._managers_of(action)
        self._queue[action.action_id] = action

    def cancel(self, action_id: str) -> bool:
        self._durs.pop(action_id, None)
        self._mgrs.pop(action_id, None)
        return self._queue.pop(action_id, None) is not None

    def finish(self, action_id: str, now: float) -> None:
        run = self._running.pop(action_id, None)
        if run is None:
            raise ConfigError(f"action {action_id!r} is not running")
        by_name = {m.name: m for m in self.managers}
        for g in run.grants:
            by_name[g.manager].release(run.action, g, now)

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
        out = []
        for c in self._decide(now) if self._queue else []:
            km = self._mgrs[c.action.action_id][0]
            out.append((c.action.action_id, c.units, c.domains[km.name]))
        return out

    def _decide(self, now: float) -> list[_Candidate]:
        ledgers = {m.name: m.ledger(now) for m in self.managers}
        cands = self._candidates(ledgers)
        selected: list[_Candidate] = []
        groups: dict[tuple[str, str], list[_Candidate]] = {}
        for c in cands:
            km = self._mgrs[c.action.action_id][0]
            groups.setdefault((km.name, c.domains[km.name]), []).append(c)
        for (mname, domain), members in groups.items():
            selected += self._elastic(mname, domain, members, ledgers[mname], cands, now)
        return selected

    # -- phase 1: FCFS candidates at minimum units -----------------------------------------
    def _candidates(self, ledgers: Mapping[str, Ledger]) -> list[_Candidate]:
        out: list[_Candidate] = []
        blocked: set[tuple[str, str | None]] = set()
        for order, a in enumerate(self._queue.values()):
            mgrs = self._mgrs[a.action_id]
            km = mgrs[0]
            lane = (km.name, km.pinned_domain(a))
            if lane in blocked:
                continue
            units = self._initial_units(a, km)
            taken: list[tuple[ResourceManager, str, int]] = []
            for m in mgrs:
                u = units if m is km else m.options(a)[0]
                d = ledgers[m.name].take(a, u)
                if d is None:
                    break
                taken.append((m, d, u))
            else:
                out.append(_Candidate(a, order, {m.name: d for m, d, _ in taken}, units))
                continue
            for m, d, u in reversed(taken):
                ledgers[m.name].give(a, d, u, full=True)
            blocked.add(lane)  # FCFS: nothing behind it in its lane jumps ahead
        return out

    def _initial_units(self, a: ActionSpec, km: ResourceManager) -> int:
        opts = self._durs[a.action_id]  # ascending
        k = self.config.fixed_units
        if k is not None and a.elastic:
            return max((u for u in opts if u <= k), default=next(iter(opts)))
        return next(iter(opts))

    # -- phase 2: greedy eviction per (key resource, domain) -------------------------------
    def _scalable(self, a: ActionSpec, km: ResourceManager) -> bool:
        return (
            self.config.fixed_units is None
            and a.elastic
            and a.elasticity is not None
            and a.t_ori_s > 0
            and len(self._durs[a.action_id]) > 1
        )

    def _elastic(
        self,
        mname: str,
        domain: str,
        members: list[_Candidate],
        ledger: Ledger,
        cands: list[_Candidate],
        now: float,
    ) -> list[_Candidate]:
        km = next(m for m in self.managers if m.name == mname)
        scal: list[_Candidate] = []
        fixed: list[_Candidate] = []
        for c in members:
            (scal if self._scalable(c.action, km) else fixed).append(c)
        if not scal:  # Line 5-6: unknown or zero elasticity: minimum units, all selected
            return members
        for c in scal:  # their minimum units return to the pool the DP splits
            ledger.give(c.action, domain, c.units)
        cap = ledger.free_units(domain)
        running = [
            max(r.end_s - now, 0.0) for r in self._running.values() if r.group == (mname, domain)
        ]
        taken = {c.action.action_id for c in cands}
        remaining = list(
            islice(
                (
                    a
                    for a in self._queue.values()
                    if a.action_id not in taken
                    and self._mgrs[a.action_id][0] is km
                    and km.pinned_domain(a) in (None, domain)
                ),
                self.config.lookahead,
            )
        )

        options = [self._options(c.action, km, cap) for c in scal]
        # Durations at the first `depth` unit counts of each action that may head the rest.
        first_cost = {id(c.action): self._head_choices(c.action, True) for c in scal}
        if remaining:
            head = remaining[0]
            first_cost[id(head)] = self._head_choices(head, self._scalable(head, km))
        base = [self._min_duration(a, km) for a in remaining]
        scal_min = [self._min_duration(c.action, km) for c in scal]

        arrange = ledger.prefixes(domain, options)

        def objective(k: int) -> tuple[float, Arrangement | None]:
            arr = arrange(k)
            if arr is None:
                return math.inf, None
            heap = running + [options[i][u] for i, u in enumerate(arr.units)]
            heap += [0.0] * min(cap - sum(arr.units), len(remaining) + len(scal) - k)
            rest = scal_min[k:] + base
            head = first_cost[id(scal[k].action if k < len(scal) else remaining[0])] if rest else []
            return arr.total + _estimate(heap, head, rest), arr

        obj, best = objective(len(scal))
        k = len(scal)
        # Line 8-11: evict the last while the objective falls. NOTE: unlike the pseudocode's
        # t = 1..|C_j|, at least one candidate stays: evicting all could leave the domain idle
        # with nothing running, and then no completion would ever trigger the next pass.
        for t in range(1, len(scal)):
            new_obj, arr = objective(len(scal) - t)
            if new_obj >= obj:
                break
            obj, best, k = new_obj, arr, len(scal) - t
        assert best is not None, "candidates fit at minimum units, so DPArrange is feasible"
        for c, u in zip(scal[:k], best.units, strict=True):
            c.units = u
        return fixed + scal[:k]

    def _options(self, a: ActionSpec, km: ResourceManager, cap: int) -> dict[int, float]:
        durs = self._durs[a.action_id]
        return durs if next(reversed(durs)) <= cap else {u: d for u, d in durs.items() if u <= cap}

    def _min_duration(self, a: ActionSpec, km: ResourceManager) -> float:
        return next(iter(self._durs[a.action_id].values()))  # ascending units

    def _head_choices(self, a: ActionSpec, scalable: bool) -> list[float]:
        durs = self._durs[a.action_id].values()
        return list(islice(durs, self.config.depth if scalable else 1))

    # -- phase 3: concrete allocation ------------------------------------------------------
    def _start(self, selected: list[_Candidate], now: float) -> list[Start]:
        out: list[Start] = []
        # Largest first within a domain: exact for power-of-two chunks (see GPU manager).
        for c in sorted(selected, key=lambda c: (-c.units, c.order)):
            a = c.action
            mgrs = self._mgrs.pop(a.action_id)
            km = mgrs[0]
            grants = tuple(
                m.allocate(a, c.units if m is km else m.options(a)[0], c.domains[m.name], now)
                for m in mgrs
            )
            overhead = max((g.overhead_s for g in grants), default=0.0)
            expected = self._durs.pop(a.action_id)[c.units]
            domain = c.domains[km.name]
            del self._queue[a.action_id]
            self._running[a.action_id] = _Running(
                a, grants, (km.name, domain), now + overhead + expected
            )
            out.append(
                Start(
                    action=a,
                    units=c.units,
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
def tangram(managers: Sequence[ResourceManager], depth: int = 2) -> ElasticScheduler:
    return ElasticScheduler(managers, TangramConfig(depth=depth))


@ACTION_POLICIES.register(ActionPolicyKind.DOP4)
def dop4(managers: Sequence[ResourceManager]) -> ElasticScheduler:
    return ElasticScheduler(managers, TangramConfig(fixed_units=4))


@ACTION_POLICIES.register(ActionPolicyKind.DOP16)
def dop16(managers: Sequence[ResourceManager]) -> ElasticScheduler:
    return ElasticScheduler(managers, TangramConfig(fixed_units=16))


def _estimate(heap: list[float], head: list[float], durations: list[float]) -> float:
    """Algorithm 2's ESTIMATE: each remaining action starts when the earliest slot of the
    completion heap frees; the first one tries each of its `depth` allocations (`head`)."""
    if not durations:
        return 0.0
    best = math.inf
    base = sorted(heap)  # a sorted list is a valid heap
    for first in head:
        h = list(base)
        total = 0.0
        for i, dur in enumerate(durations):
            ts = heapq.heappop(h) if h else 0.0
            end = ts + (first if i == 0 else dur)
            total += end
            heapq.heappush(h, end)
        best = min(best, total)
    return best
