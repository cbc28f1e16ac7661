"""Invariants of the rollout simulator under every scheduler and router."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec, TurnSpec, WorkloadKind
from loom.rollout.baselines import CacheAwareRouter, HybridRouter, LeastLoadRouter
from loom.rollout.heddle.planner import DegreeCostModel
from loom.rollout.heddle.router import HeddleRouter
from loom.rollout.policy import SCHEDULERS, SchedulerKind, WorkerLayout
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
