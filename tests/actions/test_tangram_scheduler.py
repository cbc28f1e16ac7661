"""Tangram's elastic scheduler (Algorithm 1): invariants under random workloads, FCFS lanes,
minimum units for unknown elasticity, fixed-DoP baselines, and greedy eviction."""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from contextlib import AbstractContextManager
from unittest.mock import patch

import pytest
from action_factories import (
    api_action,
    basic_manager,
    cpu_action,
    cpu_manager,
    gpu_action,
    gpu_manager,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.actions.managers.base import Ledger
from loom.actions.managers.cpu import _CpuLedger
from loom.actions.policy import ACTION_POLICIES, Start
from loom.actions.tangram.arrange import dp_arrange
from loom.actions.tangram.scheduler import ElasticScheduler, TangramConfig
from loom.core.actions import ActionSpec
from loom.core.errors import ConfigError


def drain(sched: ElasticScheduler, actions: list[ActionSpec], api_limit: int = 2) -> list:
    """Run every action to completion on expected durations, checking capacity at each step.
    Returns (start time, action id, units, cores, gpus) in start order."""
    for a in actions:
        sched.submit(a, 0.0)
    now, log = 0.0, []
    running: dict[str, tuple[float, Start]] = {}
    for _ in range(10 * len(actions) + 10):
        for s in sched.schedule(now):
            running[s.action.action_id] = (now + s.overhead_s + s.expected_s, s)
            log.append((now, s.action.action_id, s.units, s.cores, s.gpus))
        cores = [(s.domain, c) for _, s in running.values() for c in s.cores]
        gpus = [(s.domain, g) for _, s in running.values() for g in s.gpus]
        assert len(cores) == len(set(cores)), "a core is held twice"
        assert len(gpus) == len(set(gpus)), "a GPU is held twice"
        apis = sum(1 for _, s in running.values() if s.action.kind == "api")
        assert apis <= api_limit, "API concurrency exceeded"
        for _, s in running.values():
            assert s.units in s.action.demand[s.action.key_resource or "api:search"].values()
        if not running:
            if sched.queued == 0:
                break
            wake = sched.next_wakeup(now)
            assert wake is not None, "queued actions but nothing running and no wake-up"
            now = wake
            continue
        aid = min(running, key=lambda k: (running[k][0], k))
        now = running.pop(aid)[0]
        sched.finish(aid, now)
    assert sched.queued == 0 and sched.running == 0
    started = [e[1] for e in log]
    assert sorted(started) == sorted(a.action_id for a in actions), "an action was lost"
    return log


action_lists = st.lists(
    st.one_of(
        st.builds(
            lambda lo, span, t, p: ("cpu", lo, lo + span, t, p),
            st.integers(1, 4),
            st.integers(0, 12),
            st.floats(0.1, 50.0),
            st.one_of(st.none(), st.floats(0.0, 1.0)),
        ),
        st.builds(lambda d: ("gpu", d), st.sampled_from([(1, 2, 4, 8), (2, 4), (8,), (1,)])),
        st.just(("api",)),
    ),
    min_size=1,
    max_size=25,
)


def build(spec: list[tuple], seed_traj: int = 3) -> list[ActionSpec]:
    out = []
    for i, s in enumerate(spec):
        if s[0] == "cpu":
            _, lo, hi, t, p = s
            out.append(cpu_action(i, traj=f"t{i % seed_traj}", lo=lo, hi=hi, t=t, p=p, mem=2))
        elif s[0] == "gpu":
            out.append(gpu_action(i, "judge", dops=s[1]))
        else:
            out.append(api_action(i))
    return out


def managers():
    return [cpu_manager(cores=16, nodes=2), gpu_manager(), basic_manager(concurrency=2, quota=5)]


@settings(max_examples=60, deadline=None)
@given(action_lists, st.sampled_from(["tangram", "dop4", "dop16"]))
def test_every_action_runs_once_within_capacity(spec: list[tuple], policy: str) -> None:
    sched = ACTION_POLICIES.get(policy)(managers())
    drain(sched, build(spec))


@settings(max_examples=20, deadline=None)
@given(action_lists)
def test_same_input_same_decisions(spec: list[tuple]) -> None:
    assert drain(ElasticScheduler(managers()), build(spec)) == drain(
        ElasticScheduler(managers()), build(spec)
    )


def test_lone_scalable_action_gets_its_fastest_allocation() -> None:
    sched = ElasticScheduler([cpu_manager(cores=16)])
    sched.submit(cpu_action(0, hi=32, p=0.95), 0.0)
    (s,) = sched.schedule(0.0)
    assert s.units == 16  # duration falls with every core here
    assert s.expected_s == pytest.approx(s.action.duration_s(16))


def test_unknown_elasticity_gets_minimum_units() -> None:
    sched = ElasticScheduler([cpu_manager(cores=16)])
    sched.submit(cpu_action(0, lo=2, hi=16, p=None), 0.0)
    (s,) = sched.schedule(0.0)
    assert s.units == 2


def test_fixed_dop_baselines() -> None:
    for policy, want in (("dop4", 4), ("dop16", 16)):
        sched = ACTION_POLICIES.get(policy)([cpu_manager(cores=32, numa=1)])
        sched.submit(cpu_action(0, hi=32), 0.0)
        sched.submit(cpu_action(1, lo=1, hi=1), 0.0)
        units = {s.action.action_id: s.units for s in sched.schedule(0.0)}
        assert units == {"c0": want, "c1": 1}


def test_fcfs_head_blocks_its_lane_only() -> None:
    sched = ElasticScheduler([cpu_manager(cores=8, numa=1), basic_manager()])
    sched.submit(cpu_action(0, lo=6, hi=6, traj="x"), 0.0)
    first = sched.schedule(0.0)
    assert [s.action.action_id for s in first] == ["c0"]
    sched.submit(cpu_action(1, lo=4, hi=4, traj="x"), 1.0)  # does not fit: 2 cores free
    sched.submit(cpu_action(2, lo=1, hi=1, traj="x"), 1.0)  # would fit, but is behind c1
    sched.submit(api_action(3), 1.0)  # another lane: starts
    started = [s.action.action_id for s in sched.schedule(1.0)]
    assert started == ["a3"]
    sched.finish("c0", 2.0)
    assert sorted(s.action.action_id for s in sched.schedule(2.0)) == ["c1", "c2"]


def test_greedy_eviction_trades_queueing_for_parallelism() -> None:
    # Four perfectly parallel 40 s actions on 4 cores: all at one core gives ACTs of 40 each
    # (160). Evicting the last lets the first run on two cores; the approximated objective
    # (Appendix A) falls to 140, and evicting another does not lower it further.
    sched = ElasticScheduler([cpu_manager(cores=4, numa=1)], TangramConfig(depth=2))
    for i in range(4):
        sched.submit(cpu_action(i, hi=4, t=40.0, p=1.0), 0.0)
    starts = sched.schedule(0.0)
    assert sorted((s.action.action_id, s.units) for s in starts) == [
        ("c0", 2),
        ("c1", 1),
        ("c2", 1),
    ]
    assert sched.queued == 1


def _behind_a_wide_action(queued: int, cores: int = 8, held: int = 4) -> ElasticScheduler:
    """`held` of `cores` cores run a 1 s action; then `queued` perfectly parallel 40 s actions
    (1..`cores` cores each) arrive."""
    sched = ElasticScheduler([cpu_manager(cores=cores, numa=1)])
    sched.submit(cpu_action(99, lo=held, hi=held, t=1.0, p=None), 0.0)
    assert [s.units for s in sched.schedule(0.0)] == [held]
    for i in range(queued):
        sched.submit(cpu_action(i, hi=cores, t=40.0, p=1.0), 0.0)
    return sched


def test_completion_heap_counts_the_units_a_completion_frees() -> None:
    # Four candidates fit the four free cores and one action waits behind them. The running
    # action frees four cores at t=1, enough to start four waiting single-core actions then.
    # With one heap entry per unit the objective falls from 181 (all four at one core: 4*40,
    # plus 21 for the one behind on two cores) to 162 (one evicted) to 143 (two evicted: 20+20
    # on two cores each, then 21, 41, 41 behind), and rises at three evicted (163). One entry
    # per action lets the 1 s completion start one waiting action only, so the rest wait for
    # the candidates' own ends and evicting never pays: all four would start on one core.
    starts = _behind_a_wide_action(5).schedule(0.0)
    assert sorted((s.action.action_id, s.units) for s in starts) == [("c0", 2), ("c1", 2)]


def test_a_lone_candidate_may_wait_for_a_completion() -> None:
    # Line 8 runs t up to |C_j|: the only candidate is evicted when waiting 1 s for the cores
    # the running action frees (ESTIMATE's second choice: 1 + 20 s) beats one core now (40 s).
    sched = _behind_a_wide_action(1, cores=4, held=3)
    assert sched.schedule(0.0) == [] and sched.queued == 1
    sched.finish("c99", 1.0)
    (s,) = sched.schedule(1.0)
    assert (s.action.action_id, s.units) == ("c0", 4)


def test_an_idle_domain_never_holds_its_lone_candidate_back() -> None:
    # Nothing runs to free a second core, so ESTIMATE's two-core choice is infeasible and the
    # candidate starts on the one core (evicting it would leave the domain idle for good).
    sched = ElasticScheduler([cpu_manager(cores=1, numa=1)])
    sched.submit(cpu_action(0, hi=4, t=40.0, p=1.0), 0.0)
    assert [s.units for s in sched.schedule(0.0)] == [1]


def test_bad_submissions_raise() -> None:
    sched = ElasticScheduler([cpu_manager(cores=8)])
    sched.submit(cpu_action(0), 0.0)
    with pytest.raises(ConfigError, match="already queued"):
        sched.submit(cpu_action(0), 0.0)
    with pytest.raises(ConfigError, match="no resource manager"):
        sched.submit(gpu_action(1, "judge"), 0.0)
    with pytest.raises(ConfigError, match="not running"):
        sched.finish("c0", 1.0)
    assert sched.cancel("c0") and not sched.cancel("c0")


# ---- the cached fast path against the straightforward one ----------------------------------


class _Straightforward(ElasticScheduler):
    """The reference path: no per-action table (DPArrange re-checks plain mappings on every
    pass) and, with `_plain_dp`, every eviction prefix solved by its own full DP table."""

    def submit(self, action: ActionSpec, now: float) -> None:
        super().submit(action, now)
        self._queue[action.action_id].table = None


def _plain_dp() -> AbstractContextManager[object]:
    return patch.object(_CpuLedger, "prefixes", Ledger.prefixes)


def _seeded_actions(seed: int) -> list[ActionSpec]:
    """CPU actions over shared trajectories (lanes, pins, memory), some with unknown or
    non-convex elasticity, among GPU and API ones; random floats, so no decision is a tie."""
    rng = random.Random(seed)
    out = []
    for i in range(rng.randint(1, 40)):
        roll = rng.random()
        if roll < 0.75:
            lo = rng.randint(1, 3)
            hi = lo + rng.randint(0, 16)
            a = cpu_action(
                i,
                traj=f"t{rng.randint(0, 5)}",
                lo=lo,
                hi=hi,
                t=rng.lognormvariate(2.0, 1.0),
                p=None if roll < 0.08 else rng.uniform(0.2, 1.0),
                mem=rng.choice([0, 0, 2]),
            )
            if roll > 0.65:  # a bumpy speedup: savings that grow, so DPArrange's table
                bumpy = {m: rng.uniform(0.3, 1.0) for m in range(lo, hi + 1)}
                a = dataclasses.replace(a, elasticity=bumpy)
            out.append(a)
        elif roll < 0.9:
            out.append(gpu_action(i, "judge", dops=rng.choice([(1, 2, 4, 8), (2, 4), (1,)])))
        else:
            out.append(api_action(i))
    return out


def _passes(sched: ElasticScheduler, actions: list[ActionSpec]) -> list:
    """Drain on expected durations; each pass's plan must be what it then starts."""
    for a in actions:
        sched.submit(a, 0.0)
    now, log, running = 0.0, [], {}
    for _ in range(10 * len(actions) + 10):
        plan = sched.plan(now)
        starts = sched.schedule(now)
        assert sorted(plan) == sorted((s.action.action_id, s.units, s.domain) for s in starts)
        for s in starts:
            running[s.action.action_id] = now + s.overhead_s + s.expected_s
            log.append((now, s.action.action_id, s.units, s.domain, s.cores, s.gpus))
        if not running:
            if sched.queued == 0:
                break
            wake = sched.next_wakeup(now)
            assert wake is not None
            now = wake
            continue
        aid = min(running, key=lambda k: (running[k], k))
        now = running.pop(aid)
        sched.finish(aid, now)
    assert sched.queued == 0
    return log


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 4]))
def test_fast_path_decides_as_the_straightforward_path(seed: int, cpu_nodes: int) -> None:
    def mgrs() -> list:
        return [
            cpu_manager(cores=32 // cpu_nodes, nodes=cpu_nodes),
            gpu_manager(),
            basic_manager(concurrency=2, quota=5),
        ]

    fast = _passes(ElasticScheduler(mgrs()), _seeded_actions(seed))
    with _plain_dp():
        assert _passes(_Straightforward(mgrs()), _seeded_actions(seed)) == fast


def _written_out_plan(actions: list[ActionSpec], cores: int, depth: int = 2) -> list:
    """Algorithm 1 on one idle node, recomputing everything: the FCFS prefix at minimum units,
    DPArrange's full table for each eviction prefix, ESTIMATE with pop and push (every action
    its own trajectory, no memory, default lookahead)."""
    durs = {a.action_id: {u: a.duration_s(u) for u in a.demand["cpu"].values()} for a in actions}
    least = {a.action_id: a.demand["cpu"].minimum for a in actions}
    cands, free = [], cores
    for a in actions:
        if least[a.action_id] > free:
            break
        cands.append(a)
        free -= least[a.action_id]

    def scalable(a: ActionSpec) -> bool:
        return a.elasticity is not None and len(durs[a.action_id]) > 1

    scal = [a for a in cands if scalable(a)]
    fixed = [(a.action_id, least[a.action_id], "n0") for a in cands if not scalable(a)]
    if not scal:
        return fixed
    cap = cores - sum(units for _, units, _ in fixed)
    remaining = actions[len(cands) :][:128]
    opts = [{u: d for u, d in durs[a.action_id].items() if u <= cap} for a in scal]

    def first(a: ActionSpec) -> float:
        return durs[a.action_id][least[a.action_id]]

    def estimate(heap: list[float], head: list[tuple[int, float]], rest: list[ActionSpec]) -> float:
        """One heap entry per core (when it frees); an action takes its least cores (the first
        tries each of `head`), starts when the last of them frees, frees them at its end."""
        best = math.inf
        for lead in head:
            h = sorted(heap)
            total = 0.0
            for i, a in enumerate(rest):
                units, dur = lead if i == 0 else (least[a.action_id], first(a))
                if units > len(h):
                    total = math.inf
                    break
                start = max(heapq.heappop(h) for _ in range(units))
                total += start + dur
                for _ in range(units):
                    heapq.heappush(h, start + dur)
            best = min(best, total)
        return best if rest else 0.0

    def objective(k: int) -> tuple[float, tuple[int, ...]]:
        arr = dp_arrange(opts[:k], cap)
        assert arr is not None
        heap = [durs[aid][u] for aid, u, _ in fixed for _ in range(u)]
        heap += [opts[i][u] for i, u in enumerate(arr.units) for _ in range(u)]
        heap += [0.0] * (cap - sum(arr.units))
        rest = scal[k:] + remaining
        head: list[tuple[int, float]] = []
        if rest:
            head = list(durs[rest[0].action_id].items())[: depth if scalable(rest[0]) else 1]
        return arr.total + estimate(heap, head, rest), arr.units

    (obj, best), k = objective(len(scal)), len(scal)
    # Every candidate may go (t up to |C_j|) unless nothing else would run on the idle node.
    for t in range(1, len(scal) + (1 if fixed else 0)):
        new, units = objective(len(scal) - t)
        if new >= obj:
            break
        obj, best, k = new, units, len(scal) - t
    return fixed + [(a.action_id, u, "n0") for a, u in zip(scal[:k], best, strict=True)]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 80), st.integers(0, 60))
def test_fast_plan_matches_on_one_big_node(seed: int, n: int, behind: int) -> None:
    """The benchmark's shape, smaller: many candidates over one node (a few with unknown
    elasticity or one unit count) and a queue behind them: the fast path, the straightforward
    path and Algorithm 1 written out plan the same."""
    rng = random.Random(seed)
    actions = [
        cpu_action(
            i,
            lo=rng.randint(1, 2),
            hi=rng.randint(2, 32),
            t=rng.lognormvariate(3.0, 1.0),
            p=None if rng.random() < 0.05 else rng.uniform(0.8, 0.99),
        )
        for i in range(n + behind)
    ]
    fast = ElasticScheduler([cpu_manager(cores=64)])
    slow = _Straightforward([cpu_manager(cores=64)])
    for a in actions:
        fast.submit(a, 0.0)
        slow.submit(a, 0.0)
    want = sorted(_written_out_plan(actions, 64))
    assert sorted(fast.plan(0.0)) == want
    with _plain_dp():
        assert sorted(slow.plan(0.0)) == want
    assert sorted((s.action.action_id, s.units, s.domain) for s in fast.schedule(0.0)) == want


def test_submission_caches_the_key_resource_table() -> None:
    sched = ElasticScheduler([cpu_manager(cores=16)])
    sched.submit(cpu_action(0, lo=2, hi=6, t=12.0, p=0.9), 0.0)
    sched.submit(cpu_action(1, lo=2, hi=6, p=None), 0.0)
    scalable, unknown = sched._queue["c0"], sched._queue["c1"]
    assert scalable.table is not None and dict(scalable.table) == scalable.durs
    assert list(scalable.durs) == [2, 3, 4, 5, 6]
    assert scalable.durs[4] == scalable.action.duration_s(4)
    assert unknown.table is None and not unknown.scalable  # never arranged


# -- arrival lookahead (beyond Algorithm 2) ------------------------------------------------
def _lone_after_steady_stream(lookahead: bool, arrivals: int = 10) -> int:
    """Units a lone arrival gets at an idle 64-core node after `arrivals` others came one a
    second (each ran briefly, so every arrival found the node idle)."""
    sched = ElasticScheduler(
        [cpu_manager(cores=64, numa=1)], TangramConfig(lookahead_arrivals=lookahead)
    )
    for i in range(arrivals + 1):
        sched.submit(cpu_action(i, hi=32, t=100.0, p=0.92), float(i))
        (s,) = sched.schedule(float(i))
        if i == arrivals:
            return s.units
        sched.finish(s.action.action_id, i + 0.5)
    raise AssertionError("unreachable")


def test_lookahead_trades_a_lone_arrivals_units_for_expected_arrivals() -> None:
    assert _lone_after_steady_stream(False) == 32  # Algorithm 1: every free core it can use
    with_lookahead = _lone_after_steady_stream(True)
    # About ten more are expected within its ~11 s at 32 cores, on 64 cores.
    assert 1 <= with_lookahead < 32
    # With none observed, nothing is expected: the same as Algorithm 1.
    assert _lone_after_steady_stream(True, arrivals=0) == 32


def test_estimate_counts_an_expected_arrivals_act_from_its_arrival() -> None:
    from loom.actions.tangram.scheduler import _estimate

    durs = {1: 8.0, 2: 4.0}
    free_then_busy = [0.0, 0.0, 10.0, 10.0]
    # Arriving at 1 s on two free units: it takes both, ACT 4 s.
    assert _estimate(list(free_then_busy), [], [], [(1.0, 1, 2, [1, 2], durs)]) == 4.0
    # A second at 2 s finds none free, waits for its least (a unit frees at 5 s): 3 + 8 s.
    two = [(1.0, 1, 2, [1, 2], durs), (2.0, 1, 2, [1, 2], durs)]
    assert _estimate(list(free_then_busy), [], [], two) == 4.0 + 11.0
    # Capped at one unit each, both start on arrival: 8 + 8 s.
    assert _estimate(list(free_then_busy), [], [], two, limit=1) == 16.0
    # One wanting more units than the domain holds takes them all (a pass gives no more).
    wide = {1: 8.0, 2: 4.0, 4: 2.0, 8: 1.0}
    assert _estimate([0.0] * 4, [], [], [(1.0, 1, 8, [1, 2, 4, 8], wide)]) == 2.0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2]))
def test_lookahead_without_observed_arrivals_is_algorithm_1(seed: int, cpu_nodes: int) -> None:
    def mgrs() -> list:
        return [cpu_manager(cores=32, nodes=cpu_nodes), gpu_manager(), basic_manager()]

    plans = []
    for on in (False, True):
        sched = ElasticScheduler(mgrs(), TangramConfig(lookahead_arrivals=on))
        for a in _seeded_actions(seed):
            sched.submit(a, 0.0)
        plans.append(sched.plan(0.0))
    assert plans[0] == plans[1]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_lookahead_drains_every_action_as_it_plans(seed: int) -> None:
    mgrs = [cpu_manager(cores=32, nodes=2), gpu_manager(), basic_manager()]
    actions = _seeded_actions(seed)
    log = _passes(ElasticScheduler(mgrs, TangramConfig(lookahead_arrivals=True)), actions)
    assert sorted(e[1] for e in log) == sorted(a.action_id for a in actions)
