"""Invariants of the rollout simulator under every scheduler and router."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec, TurnSpec, WorkloadKind
from loom.rollout.baselines import CacheAwareRouter, HybridRouter, LeastLoadRouter
from loom.rollout.heddle.planner import DegreeCostModel
from loom.rollout.heddle.router import HeddleRouter
from loom.rollout.moves import slot_wait_s
from loom.rollout.policy import SCHEDULERS, Router, SchedulerKind, WorkerLayout
from loom.sim.rollout import RolloutConfig, RolloutSimulator
from loom.sim.workloads import AgenticWorkload

COST = DegreeCostModel(gpu="h100", model="qwen3-8b", context_per_seq=4000, max_group=64)
ROUTERS = {
    "cache": CacheAwareRouter,
    "least": LeastLoadRouter,
    "hybrid": HybridRouter,
    "heddle": lambda: HeddleRouter(COST),
}


def _oracle(trajs):
    return [
        tuple(float(t.output_tokens) * (1 + 0.1 * k) for k in range(t.num_turns)) for t in trajs
    ]


def _run(trajs, layout, sched, router, cfg=None, preds=None):
    cfg = cfg or RolloutConfig(model="qwen3-8b")
    sim = RolloutSimulator(
        trajs,
        WorkerLayout(degrees=layout),
        SCHEDULERS.get(sched)(),
        ROUTERS[router](),
        cfg,
        predictions=preds,
    )
    return sim, sim.run()


@pytest.fixture(scope="module")
def batch():
    return AgenticWorkload(kind=WorkloadKind.CODING, model="qwen3-8b", num_prompts=4).sample(1)


@pytest.mark.parametrize("sched", [k.value for k in SchedulerKind])
@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_nothing_lost_nothing_over_capacity(batch, sched, router):
    sim, res = _run(batch, (4, 2, 1, 1), sched, router, preds=_oracle(batch))
    assert np.all(np.isfinite(res.finish_s))  # every trajectory finished
    assert res.output_tokens == sum(t.output_tokens for t in batch)
    for w in sim.workers:
        assert w.peak_used <= w.capacity
        assert w.used == 0 and not w.running and not w.waiting
    # A trajectory cannot finish before its own tool time plus one token per output.
    floor = np.array([t.tool_time_s for t in batch])
    assert np.all(res.finish_s >= floor)


def test_same_seed_same_result(batch):
    _, a = _run(batch, (2, 2), "pps", "heddle", preds=_oracle(batch))
    _, b = _run(batch, (2, 2), "pps", "heddle", preds=_oracle(batch))
    assert a.makespan_s == b.makespan_s
    assert np.array_equal(a.finish_s, b.finish_s) and a.prefill_tokens == b.prefill_tokens


@pytest.mark.parametrize("sched", ["pps", "fcfs"])
def test_mean_active_is_the_mean_lifetime_over_the_makespan(batch, sched):
    # Every trajectory is alive from 0 to its finish, so the time-average of the active count
    # is the sum of finish times over the makespan.
    _, res = _run(batch, (2, 1, 1), sched, "heddle", preds=_oracle(batch))
    expected = res.finish_s.sum() / res.makespan_s
    assert res.mean_active == pytest.approx(expected, rel=1e-9)
    assert 1.0 <= res.mean_active <= len(batch)
    # The active series steps down at every finish: its time-average is the same.
    t = np.array([s[0] for s in res.active_series] + [res.makespan_s])
    n = np.array([s[1] for s in res.active_series], dtype=float)
    assert np.dot(n, np.diff(t)) / res.makespan_s == pytest.approx(expected, rel=1e-9)


def test_cache_affinity_saves_prefill(batch):
    _, pinned = _run(batch, (1, 1, 1, 1), "rr", "cache")
    _, spread = _run(batch, (1, 1, 1, 1), "rr", "least")
    assert pinned.cache_hit_tokens > spread.cache_hit_tokens
    assert pinned.prefill_tokens < spread.prefill_tokens


def test_tiny_kv_forces_queueing_but_loses_nothing():
    step = TurnSpec(input_tokens=2000, output_tokens=500, tool_latency_s=0.2)
    turns = (step, step, step, TurnSpec(input_tokens=100, output_tokens=50, tool_latency_s=None))
    trajs = [
        TrajectorySpec(
            traj_id=i, prompt_id=0, sample_idx=i, workload=WorkloadKind.MATH, turns=turns
        )
        for i in range(60)
    ]

    class SmallKv:
        tp, num_gpus, kv_capacity_tokens = 1, 1, 40_000

        def iteration_time(self, b, c, p=0, pc=0):
            return 1e-3 + 1e-5 * b + 1e-8 * c + 2e-5 * p

    sim = RolloutSimulator(
        trajs,
        WorkerLayout(degrees=(1,)),
        SCHEDULERS.get("pps")(),
        CacheAwareRouter(),
        RolloutConfig(model="qwen3-8b"),
        predictions=_oracle(trajs),
        latency=lambda tp: SmallKv(),
    )
    res = sim.run()
    assert np.all(np.isfinite(res.finish_s))
    assert sim.workers[0].peak_used <= 40_000
    assert res.queue_delay_s.sum() > 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 12),
    seed=st.integers(0, 10_000),
    layout=st.sampled_from([(1,), (1, 1), (2, 1, 1), (4, 4)]),
    sched=st.sampled_from([k.value for k in SchedulerKind]),
    router=st.sampled_from(sorted(ROUTERS)),
)
def test_random_batches_complete(n, seed, layout, sched, router):
    rng = np.random.default_rng(seed)
    trajs = []
    for i in range(n):
        k = int(rng.integers(1, 5))
        turns = tuple(
            TurnSpec(
                input_tokens=int(rng.integers(1, 3000)),
                output_tokens=int(rng.integers(1, 900)),
                tool_latency_s=None if j == k - 1 else float(rng.exponential(0.5)),
            )
            for j in range(k)
        )
        trajs.append(
            TrajectorySpec(
                traj_id=i,
                prompt_id=i // 4,
                sample_idx=i % 4,
                workload=WorkloadKind.SEARCH,
                turns=turns,
            )
        )
    sim, res = _run(trajs, layout, sched, router, preds=_oracle(trajs))
    assert np.all(np.isfinite(res.finish_s))
    assert res.output_tokens == sum(t.output_tokens for t in trajs)
    assert all(w.peak_used <= w.capacity for w in sim.workers)


def test_bad_input_is_rejected(batch):
    cfg = RolloutConfig(model="qwen3-8b")
    with pytest.raises(ConfigError, match="at least one trajectory"):
        RolloutSimulator(
            [], WorkerLayout(degrees=(1,)), SCHEDULERS.get("rr")(), CacheAwareRouter(), cfg
        )
    with pytest.raises(ConfigError, match="straddle"):
        RolloutSimulator(
            batch, WorkerLayout(degrees=(4, 8)), SCHEDULERS.get("rr")(), CacheAwareRouter(), cfg
        )
    with pytest.raises(ConfigError, match="one prediction"):
        RolloutSimulator(
            batch,
            WorkerLayout(degrees=(1,)),
            SCHEDULERS.get("rr")(),
            CacheAwareRouter(),
            cfg,
            predictions=[(1.0,)],
        )


@pytest.mark.parametrize("router", ["cache", "heddle"])
def test_dispatch_delay_adds_once_per_turn_on_an_idle_cluster(router):
    # One trajectory alone: nothing else moves, so each of its turns reaches the worker
    # `dispatch_delay_s` later and the trajectory ends that much later per turn.
    traj = TrajectorySpec(
        traj_id=0,
        prompt_id=0,
        sample_idx=0,
        workload=WorkloadKind.CODING,
        turns=(TurnSpec(512, 64, 2.0), TurnSpec(128, 32, 1.0), TurnSpec(64, 16, None)),
    )
    base = RolloutConfig(model="qwen3-8b")
    late = RolloutConfig(model="qwen3-8b", dispatch_delay_s=0.25)
    _, a = _run([traj], (1, 1), "pps", router, base, _oracle([traj]))
    _, b = _run([traj], (1, 1), "pps", router, late, _oracle([traj]))
    assert b.makespan_s == pytest.approx(a.makespan_s + 3 * 0.25, rel=1e-9)
    assert b.output_tokens == a.output_tokens and b.prefill_tokens == a.prefill_tokens


def test_dispatch_delay_slows_a_contended_batch_but_loses_nothing(batch):
    _, a = _run(batch, (2, 2), "pps", "heddle", preds=_oracle(batch))
    late = RolloutConfig(model="qwen3-8b", dispatch_delay_s=0.5)
    _, b = _run(batch, (2, 2), "pps", "heddle", late, _oracle(batch))
    assert b.output_tokens == a.output_tokens
    assert np.all(b.finish_s >= np.array([t.tool_time_s + 0.5 * t.num_turns for t in batch]))


def test_router_decisions_are_one_at_a_time():
    # Decisions far longer than a turn: the k-th first turn reaches its worker after k
    # decisions and runs alone, and a second turn waits for no one (the others are done).
    def traj(i, turns):
        return TrajectorySpec(
            traj_id=i, prompt_id=i, sample_idx=0, workload=WorkloadKind.MATH, turns=turns
        )

    one = (TurnSpec(256, 32, None),)
    two = (TurnSpec(256, 32, 5.0), TurnSpec(64, 32, None))
    alone = _run([traj(0, one)], (1,), "fcfs", "least")[1].makespan_s
    alone_two = _run([traj(0, two)], (1,), "fcfs", "least")[1].makespan_s
    cfg = RolloutConfig(model="qwen3-8b", router_decision_s=100.0)
    _, res = _run([traj(0, one), traj(1, one), traj(2, one)], (1,), "fcfs", "least", cfg)
    assert res.finish_s == pytest.approx([100 + alone, 200 + alone, 300 + alone], rel=1e-9)
    _, res = _run([traj(0, two)], (1,), "fcfs", "least", cfg)
    assert res.makespan_s == pytest.approx(200 + alone_two, rel=1e-9)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
@pytest.mark.parametrize("name", ["dispatch_delay_s", "router_decision_s"])
def test_dispatch_delay_must_be_a_time(bad, name):
    with pytest.raises(ConfigError, match=name):
        RolloutConfig(**{name: bad})


class _Flipper(Router):
    """Every trajectory starts on worker 0 and, at each tool call and whenever it waits in a
    queue (`stale` names every trajectory after each turn), asks to move to the other worker;
    it moves only where `move_pays` (when injected) says so. Counts asks and moves."""

    def __init__(self) -> None:
        self.homes: dict[int, int] = {}
        self.asked = self.moved = 0

    def stale(self):
        return list(self.homes)

    def route(self, t, workers, now):
        return self.homes.setdefault(t.traj_id, 0)

    def migrate(self, t, workers, now):
        home = self.homes.setdefault(t.traj_id, 0)
        other = 1 - home
        self.asked += 1
        if self.move_pays is not None and not self.move_pays(t, home, other):
            return None
        self.moved += 1
        self.homes[t.traj_id] = other
        return other


def _flip(trajs, **cfg):
    router = _Flipper()
    cfg = RolloutConfig(model="qwen3-8b", migrate_kv=False, **cfg)
    res = RolloutSimulator(
        trajs, WorkerLayout(degrees=(1, 1)), SCHEDULERS.get("fcfs")(), router, cfg
    ).run()
    assert res.output_tokens == sum(t.output_tokens for t in trajs)  # nothing lost
    assert np.all(np.isfinite(res.finish_s))
    return router, res


def _agents(n, turns=3):
    return [
        TrajectorySpec(
            traj_id=i,
            prompt_id=i,
            sample_idx=0,
            workload=WorkloadKind.CODING,
            turns=(
                *(TurnSpec(2048 if k == 0 else 256, 256, 1.0) for k in range(turns - 1)),
                TurnSpec(256, 256, None),
            ),
        )
        for i in range(n)
    ]


def test_gated_moves_that_save_no_wait_are_declined():
    # Workers with room for every turn: a move saves no slot wait and would prefill the
    # context again, so the served router's rule declines every one; the run is the run of
    # a router that never moves. Without the gate (the papers' simulations) each ask moves.
    # Turns that reach a worker mid-iteration wait for its next one with slots free: the
    # router would have sent them on at once, so that wait is none of its slot waits.
    trajs = _agents(8)
    gated, res = _flip(trajs, gate_moves=True)
    assert gated.asked > 0 and gated.moved == 0
    stay = RolloutSimulator(
        trajs,
        WorkerLayout(degrees=(1, 1)),
        SCHEDULERS.get("fcfs")(),
        _Stay(),
        RolloutConfig(model="qwen3-8b", migrate_kv=False),
    ).run()
    assert res.makespan_s == pytest.approx(stay.makespan_s, rel=1e-12)
    assert res.prefill_tokens == stay.prefill_tokens
    free, moved = _flip(trajs)
    assert free.moved == free.asked > 0 and moved.prefill_tokens > res.prefill_tokens


def test_gated_moves_leave_a_long_queue_where_the_wait_pays():
    # One turn at a time per worker and every trajectory homed on worker 0: turns queue
    # there behind each other while worker 1 idles, so moving pays for its prefill.
    gated, res = _flip(_agents(8), gate_moves=True, max_running=1)
    assert gated.moved > 0
    stay = RolloutSimulator(
        _agents(8),
        WorkerLayout(degrees=(1, 1)),
        SCHEDULERS.get("fcfs")(),
        _Stay(),
        RolloutConfig(model="qwen3-8b", migrate_kv=False, max_running=1),
    ).run()
    assert res.makespan_s < stay.makespan_s


class _Stay(Router):
    def route(self, t, workers, now):
        return 0


def test_gated_slot_wait_counts_only_turns_beyond_what_the_router_would_forward():
    # The router forwards a turn at once while its engine runs fewer than `max_running` of
    # its turns; a simulated worker admits at its next iteration, so turns that arrived since
    # wait in its queue with slots free. Those are no slot wait; turns beyond the cap are.
    trajs = _agents(6)
    cfg = RolloutConfig(model="qwen3-8b", migrate_kv=False, gate_moves=True, max_running=4)
    sim = RolloutSimulator(
        trajs, WorkerLayout(degrees=(1, 1)), SCHEDULERS.get("fcfs")(), _Stay(), cfg
    )
    w = sim.workers[0]
    for t in sim.trajs[:3]:
        w.enqueue(t, poke=False)
    assert len(w.waiting) == 3 and not w.running
    assert sim._slot_wait(w) == 0.0
    for t in sim.trajs[3:]:
        w.enqueue(t, poke=False)
    assert sim._slot_wait(w) == math.inf  # two beyond the cap, and no turn has ended yet
    sim._pace[0].turn_s = 2.0
    assert sim._slot_wait(w) == slot_wait_s(0, 2.0, 2)


def test_gated_moves_pay_by_their_pace_where_no_turn_waits():
    # Room for every turn, but every trajectory starts on worker 0: with long predicted
    # remainders, decoding them on the less loaded worker repays prefilling their contexts
    # there, so some move; predicted to end now, none do. Nothing is lost either way.
    def flip(preds):
        router = _Flipper()
        cfg = RolloutConfig(model="qwen3-8b", migrate_kv=False, gate_moves=True)
        res = RolloutSimulator(
            _agents(8), WorkerLayout(degrees=(1, 1)), SCHEDULERS.get("fcfs")(), router, cfg,
            predictions=preds,
        ).run()  # fmt: skip
        return router, res

    trajs = _agents(8)
    long, res = flip([(1e5,) * t.num_turns for t in trajs])
    assert long.moved > 0
    done, stay = flip([(0.0,) * t.num_turns for t in trajs])
    assert done.asked > 0 and done.moved == 0
    assert res.output_tokens == stay.output_tokens == sum(t.output_tokens for t in trajs)


def test_a_lone_trajectory_gains_no_pace_by_moving_between_idle_workers():
    # Alone on two idle workers, its step is the same either side: with a long remainder it
    # still stays (the router counts a trajectory once, not again among the turns just ended).
    trajs = _agents(1)
    router = _Flipper()
    cfg = RolloutConfig(model="qwen3-8b", migrate_kv=False, gate_moves=True)
    RolloutSimulator(
        trajs, WorkerLayout(degrees=(1, 1)), SCHEDULERS.get("fcfs")(), router, cfg,
        predictions=[(1e5,) * trajs[0].num_turns],
    ).run()  # fmt: skip
    assert router.asked > 0 and router.moved == 0
