"""Heddle's run-time policies: PPS ordering, rank-based migration, the transmission scheduler."""

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec, TurnSpec, WorkloadKind
from loom.rollout.baselines import CacheAwareRouter
from loom.rollout.heddle.placement import WorkerCost, presorted_dp_hetero
from loom.rollout.heddle.router import HeddleRouter
from loom.rollout.heddle.scheduler import ProgressivePriorityScheduler
from loom.rollout.heddle.transmission import MigrationRequest, select_batch
from loom.rollout.policy import WorkerLayout
from loom.sim.rollout import RolloutConfig, RolloutSimulator


@dataclass
class T:
    traj_id: int
    predicted_total: float
    prompt_id: int = 0
    steps_done: int = 0
    generated: int = 0
    context: int = 0
    first_arrival_s: float = 0.0
    turn_arrival_s: float = 0.0
    host: int = -1


@dataclass
class W:
    idx: int
    tp: int
    node: int = 0
    load: int = 0

    def cached_tokens(self, traj_id):
        return 0


def test_pps_runs_longest_prediction_first_and_preempts_shorter():
    s = ProgressivePriorityScheduler()
    long, short = T(0, 9000.0), T(1, 100.0)
    assert s.key(long, 0) < s.key(short, 0)
    assert s.outranks(s.key(long, 0), s.key(short, 0))
    assert not s.outranks(s.key(short, 0), s.key(long, 0))
    assert not ProgressivePriorityScheduler(margin=1.0).outranks(-150.0, -100.0)


def test_pps_ranks_trajectories_without_a_runtime_prediction_first():
    s = ProgressivePriorityScheduler()
    planned = T(0, 30_000.0, steps_done=2)  # refined after two steps
    unplanned, unplanned_longer = T(1, 500.0), T(2, 900.0)  # prompt estimates only
    assert s.key(unplanned, 0) < s.key(planned, 0)
    assert s.key(unplanned_longer, 0) < s.key(unplanned, 0)
    assert s.outranks(s.key(unplanned, 0), s.key(planned, 0))
    literal = ProgressivePriorityScheduler(plan_first=False)  # Algorithm 1 on prompt estimates
    assert literal.key(planned, 0) < literal.key(unplanned, 0)


def _flat_latency(tp):
    class Flat:
        tp, num_gpus, kv_capacity_tokens = 1, 1, 1_000_000

        def iteration_time(self, b, c, p=0, pc=0):
            return 1e-3

    return Flat()


def test_plan_first_starts_a_long_trajectory_its_prompt_estimate_missed():
    # Two slots. Two trajectories known to be long from their prompts return from each tool
    # call predicted long; a third is as long, but its prompt estimate is the lowest. Ranked by
    # that estimate it waits for the known ones to finish; plan-first runs its first step
    # before their later ones, and its refined prediction then competes on equal terms.
    trajs = [_traj(i, outs, tool_s=0.01) for i, outs in enumerate(([1000] * 5, [1000] * 5))]
    trajs += [_traj(2, [200]), _traj(3, [200]), _traj(4, [1000] * 4, tool_s=0.01)]
    preds = [(5000.0,) * 5, (5000.0,) * 5, (300.0,), (300.0,), (100.0, 4000.0, 4000.0, 4000.0)]
    cfg = RolloutConfig(model="qwen3-8b", max_running=2, decode_reserve=0)

    def run(plan_first):
        sched = ProgressivePriorityScheduler(plan_first=plan_first)
        sim = RolloutSimulator(
            trajs,
            WorkerLayout(degrees=(1,)),
            sched,
            CacheAwareRouter(),
            cfg,
            predictions=preds,
            latency=_flat_latency,
        )
        return sim.run()

    first, literal = run(True), run(False)
    assert first.queue_delay_s[4] < literal.queue_delay_s[4]
    assert first.finish_s[4] < literal.finish_s[4]
    assert first.makespan_s < literal.makespan_s


def _cost(d):
    return WorkerCost(token_time=1.0 / d, interference=lambda k: 1.0 + 0.5 * (k - 1))


def _router(lengths, degrees, repartition=None):
    trajs = [T(i, float(x)) for i, x in enumerate(lengths)]
    workers = [W(j, d) for j, d in enumerate(degrees)]
    r = HeddleRouter(_cost, repartition=repartition)
    r.start(trajs, workers)
    return r, trajs, workers


def test_initial_placement_follows_presorted_groups():
    r, trajs, workers = _router([100, 5, 90, 4, 3, 2], (1, 1))
    homes = [r.route(t, workers, 0.0) for t in trajs]
    assert homes[0] == homes[2] == 0  # the two long ones share the first group
    assert set(homes[i] for i in (1, 3, 4, 5)) == {1}


def test_a_trajectory_predicted_longer_migrates_to_the_long_group():
    r, trajs, workers = _router([100, 5, 90, 4, 3, 2], (1, 1))
    t = trajs[5]
    t.predicted_total = 500.0  # it turned out to be the longest
    assert r.migrate(t, workers, 1.0) == 0
    assert r.route(t, workers, 1.0) == 0
    assert r.migrate(t, workers, 2.0) is None  # already there


requests = st.lists(
    st.builds(
        MigrationRequest,
        traj_id=st.integers(0, 30),
        src=st.integers(0, 5),
        dst=st.integers(0, 5),
        tokens=st.integers(0, 10_000),
        predicted_length=st.floats(0, 1e5),
    ).filter(lambda r: r.src != r.dst),
    max_size=20,
    unique_by=lambda r: r.traj_id,
)


@given(requests, st.sets(st.integers(0, 5), max_size=3))
def test_transmission_batches_are_endpoint_exclusive_and_longest_first(pending, busy):
    chosen = select_batch(pending, busy)
    ends = [e for r in chosen for e in (r.src, r.dst)]
    assert len(ends) == len(set(ends)) and not set(ends) & busy
    # Greedy maximality: every skipped request conflicts with a chosen or busy endpoint.
    taken = set(ends) | busy
    for r in pending:
        if r not in chosen:
            assert r.src in taken or r.dst in taken
    # The longest request that touches no busy endpoint is always chosen.
    free = [r for r in pending if r.src not in busy and r.dst not in busy]
    if free:
        top = min(free, key=lambda r: (-r.predicted_length, r.traj_id))
        assert top in chosen


@given(
    st.lists(st.integers(1, 1000), min_size=3, max_size=24),
    st.sampled_from([(1, 1), (2, 1, 1), (4, 2, 1, 1)]),
    st.lists(st.tuples(st.booleans(), st.integers(0, 10**6), st.integers(1, 2000)), max_size=40),
    st.sampled_from([None, 0.2, 0.5]),
)
def test_stale_names_every_trajectory_the_shrinking_partition_moves(
    lengths, degrees, ops, repartition
):
    """After every finish or prediction update, moving each trajectory `stale` names leaves
    every active trajectory at home in the slice its current rank maps to (brute force)."""
    r, trajs, workers = _router(lengths, degrees, repartition)
    active = list(trajs)
    for finish, pick, new_len in ops:
        if len(active) < 2:
            break
        t = active[pick % len(active)]
        if finish:
            active.remove(t)
            r.finish(t)
        else:
            t.predicted_total = float(new_len)
            r.migrate(t, workers, 0.0)
        for traj_id in r.stale():
            r.migrate(trajs[traj_id], workers, 0.0)
        for a in active:
            assert r.route(a, workers, 0.0) == r._target(a.traj_id), (a.traj_id, ops)


def test_stale_is_empty_without_migration():
    r, trajs, _ = _router([100, 5, 90, 4, 3, 2], (1, 1))
    r.migrate_enabled = False
    for t in trajs[:3]:
        r.finish(t)
    assert r.stale() == []


def _traj(i, outs, tool_s=0.001):
    turns = tuple(
        TurnSpec(
            input_tokens=100,
            output_tokens=o,
            tool_latency_s=tool_s if j < len(outs) - 1 else None,
        )
        for j, o in enumerate(outs)
    )
    return TrajectorySpec(
        traj_id=i, prompt_id=i, sample_idx=0, workload=WorkloadKind.MATH, turns=turns
    )


class _NoRebalance(HeddleRouter):
    def stale(self):
        return []


def _two_long_one_slot(router_cls, outs_b):
    """Worker 0 gets the two long trajectories (one slot: B waits behind A); worker 1 gets
    short ones that finish at once. As the active set shrinks, B's rank maps to worker 1."""
    outs_a = [3000] if len(outs_b) == 1 else [10, 3000]
    trajs = [_traj(0, outs_a), _traj(1, outs_b)] + [_traj(i, [10]) for i in range(2, 5)]
    preds = [(float(sum(outs_a)),) * len(outs_a), (float(sum(outs_b)),) * len(outs_b)]
    preds += [(10.0,)] * 3
    cost = lambda d: WorkerCost(token_time=1.0 / d, interference=lambda k: 1.0 + 0.5 * (k - 1))  # noqa: E731
    router = router_cls(cost)
    sim = RolloutSimulator(
        trajs,
        WorkerLayout(degrees=(1, 1)),
        ProgressivePriorityScheduler(),
        router,
        RolloutConfig(model="qwen3-8b", max_running=1, decode_reserve=0),
        predictions=preds,
        latency=_flat_latency,
    )
    res = sim.run()
    assert [len(g) for g in router.placement.groups] == [2, 3]
    return res, sim


def test_a_queued_trajectory_moves_when_the_shrinking_partition_maps_it_elsewhere():
    res, sim = _two_long_one_slot(HeddleRouter, [2900])
    stuck, _ = _two_long_one_slot(_NoRebalance, [2900])
    assert stuck.finish_s[1] > stuck.finish_s[0]  # waited for A's whole turn
    assert res.finish_s[1] < res.finish_s[0]  # ran beside A on the idle worker
    assert res.makespan_s < stuck.makespan_s
    assert sim.trajs[1].host == 1
    # Its wait on worker 0 still counts as queueing delay.
    assert res.queue_delay_s[1] > 0


def test_a_waiting_trajectory_takes_its_kv_cache_when_rebalanced():
    res, sim = _two_long_one_slot(HeddleRouter, [10, 2900])
    stuck, _ = _two_long_one_slot(_NoRebalance, [10, 2900])
    assert res.finish_s[1] < res.finish_s[0] < stuck.finish_s[1]
    assert res.migrations >= 1 and sim.trajs[1].host == 1
    # The KV moved with it: nothing was prefilled twice.
    assert res.prefill_tokens == stuck.prefill_tokens
    assert res.cache_hit_tokens == stuck.cache_hit_tokens


@given(
    st.lists(st.integers(1, 1000), min_size=4, max_size=30),
    st.sampled_from([(1, 1), (2, 1, 1), (4, 2, 1, 1)]),
    st.integers(0, 10**6),
)
def test_repartition_places_the_active_set_as_a_fresh_presorted_dp(lengths, degrees, pick):
    """Once a fifth of the trajectories has finished, the router re-runs the DP over the
    active ones: the grouping its targets imply attains that DP's optimal makespan."""
    r, trajs, _ = _router(lengths, degrees, repartition=0.2)
    active = list(trajs)
    while len(active) > 0.8 * len(trajs):
        r.finish(active.pop(pick % len(active)))
    costs = [_cost(d) for d in degrees]
    fresh = presorted_dp_hetero([a.predicted_total for a in active], costs)
    groups: dict[int, list[float]] = {}
    for a in active:
        groups.setdefault(r._target(a.traj_id), []).append(a.predicted_total)
    implied = max(
        max(g) * costs[w].token_time * costs[w].interference(len(g)) for w, g in groups.items()
    )
    assert implied == pytest.approx(fresh.makespan)


def test_repartition_must_be_a_fraction():
    with pytest.raises(ConfigError, match="repartition"):
        HeddleRouter(_cost, repartition=1.5)


def test_trajectories_joining_with_equal_predictions_spread_over_the_workers() -> None:
    from collections import Counter
    from types import SimpleNamespace

    from loom.rollout.heddle.placement import WorkerCost
    from loom.rollout.heddle.router import HeddleRouter

    workers = [SimpleNamespace(idx=i, tp=1, node=0, load=0) for i in range(3)]
    router = HeddleRouter(lambda d: WorkerCost(token_time=1.0, interference=lambda n: 1.0 + n))
    homes = []
    for i in range(30):
        t = SimpleNamespace(traj_id=i, predicted_total=1.0, steps_done=0, generated=0)
        router.join(t, workers)
        homes.append(router.route(t, workers, 0.0))
    counts = Counter(homes)
    assert len(counts) == 3 and max(counts.values()) - min(counts.values()) <= 2
