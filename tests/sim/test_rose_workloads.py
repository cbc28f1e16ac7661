"""ROSE's workloads: seeded trajectories, DAPO's redundant sampling, spot and serverless pools."""

import dataclasses
import math

import numpy as np
import pytest

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec, TurnSpec
from loom.rollout.baselines import CacheAwareRouter, FcfsScheduler
from loom.sim.rollout.simulator import RolloutSimulator
from loom.sim.workloads.rose import (
    ROSE_WORKLOADS,
    Algorithm,
    RoseTask,
    dapo_groups_to_launch,
    dapo_valid,
    group_validity_prob,
    prefill_share,
    prefill_tokens,
    serverless_lease,
    spot_trace,
    train_time_s,
    train_tokens,
)

TARGET_SHARE = {"8b": 0.77, "32b": 0.86}  # ROSE §2.2


def _workload(key, **changes):
    return dataclasses.replace(ROSE_WORKLOADS[key], **changes)


# ---- the two jobs ---------------------------------------------------------------------------
def test_jobs_match_section_6():
    w8, w32 = ROSE_WORKLOADS["8b"], ROSE_WORKLOADS["32b"]
    assert (w8.task, w8.model, w8.serving_model) == (RoseTask.FROZENLAKE, "qwen3-8b", "qwen2.5-7b")
    assert (w32.task, w32.model, w32.serving_model) == (
        RoseTask.ALFWORLD,
        "qwen3-32b",
        "qwen2.5-32b",
    )
    assert (w8.batch, w8.group, w8.groups) == (256, 16, 16)
    assert (w32.batch, w32.group, w32.groups) == (1024, 16, 64)
    assert (w8.rollout_gpus, w8.train_gpus, w8.rollout_tp, w8.max_lent_gpus) == (8, 8, 1, 16)
    assert (w32.rollout_gpus, w32.train_gpus, w32.rollout_tp, w32.max_lent_gpus) == (16, 32, 4, 64)
    assert dict(w8.steps) == {Algorithm.GRPO: 100, Algorithm.DAPO: 50}
    assert dict(w32.steps) == {Algorithm.GRPO: 40, Algorithm.DAPO: 25}
    assert (w8.slo_ttft_s, w8.slo_tpot_s, w32.slo_ttft_s, w32.slo_tpot_s) == (0.5, 0.15, 1.0, 0.45)
    assert w8.layout().degrees == (1,) * 8 and w32.layout().degrees == (4,) * 4
    assert w8.rollout_config().max_running == 16 and w32.rollout_config().max_running == 64


# ---- trajectories ---------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["8b", "32b"])
def test_sample_is_deterministic_under_seed(key):
    w = ROSE_WORKLOADS[key]
    assert w.sample(3) == w.sample(3)
    assert w.sample(3) != w.sample(4)
    assert _workload(key, seed=1).sample(3) != w.sample(3)


@pytest.mark.parametrize("key", ["8b", "32b"])
def test_ids_and_groups(key):
    w = ROSE_WORKLOADS[key]
    trajs = w.sample(0)
    assert len(trajs) == w.batch
    assert [t.traj_id for t in trajs] == list(range(w.batch))
    for g in range(w.groups):
        members = trajs[g * w.group : (g + 1) * w.group]
        assert {t.prompt_id for t in members} == {g}
        assert [t.sample_idx for t in members] == list(range(w.group))
        assert len({t.prompt_tokens for t in members}) == 1  # one environment seed, one prompt
        assert len({t.prompt_features for t in members}) == 1


def test_more_groups_extend_the_same_step():
    w = ROSE_WORKLOADS["8b"]
    few, many = w.sample(2, n_groups=3), w.sample(2, n_groups=7)
    assert len(many) == 7 * w.group
    assert many[: len(few)] == few  # DAPO's extra groups never change the first ones


@pytest.mark.parametrize("key", ["8b", "32b"])
def test_prefill_share_is_calibrated(key):
    w = ROSE_WORKLOADS[key]
    for step in (0, 1):
        assert prefill_share(w.sample(step)) == pytest.approx(TARGET_SHARE[key], abs=0.03)


@pytest.mark.parametrize("key", ["8b", "32b"])
def test_turns_respect_the_task_and_the_response_cap(key):
    w = ROSE_WORKLOADS[key]
    for t in w.sample(0):
        assert 1 <= t.num_turns <= w.profile.max_turns
        assert t.total_tokens - t.prompt_tokens <= w.max_response_tokens
        assert all(turn.tool_latency_s < 5.0 for turn in t.turns[:-1])  # fast text environments


def test_prefill_tokens_resend_the_whole_context():
    t = TrajectorySpec(
        traj_id=0,
        prompt_id=0,
        sample_idx=0,
        workload=None,
        turns=(
            TurnSpec(input_tokens=100, output_tokens=10, tool_latency_s=0.1),
            TurnSpec(input_tokens=20, output_tokens=5, tool_latency_s=None),
        ),
    )
    assert prefill_tokens(t) == 100 + (100 + 10 + 20)
    assert prefill_share([t]) == pytest.approx(230 / 245)
    assert train_tokens([t]) == 135


def test_a_batch_runs_in_the_rollout_simulator():
    w = ROSE_WORKLOADS["8b"]
    trajs = w.sample(0, n_groups=4)
    res = RolloutSimulator(
        trajs, w.layout(), FcfsScheduler(), CacheAwareRouter(), w.rollout_config()
    ).run()
    assert np.all(np.isfinite(res.finish_s))
    assert res.output_tokens == sum(t.output_tokens for t in trajs)


# ---- training time --------------------------------------------------------------------------
def test_train_time_is_six_n_tokens_over_the_training_gpus():
    w8, w32 = ROSE_WORKLOADS["8b"], ROSE_WORKLOADS["32b"]
    assert train_time_s(w8, 0) == 0.0
    assert train_time_s(w8, 2_000_000) == pytest.approx(2 * train_time_s(w8, 1_000_000))
    # 32B: 4x the parameters on 4x the GPUs of 8B.
    ratio = train_time_s(w32, 10**6) / train_time_s(w8, 10**6)
    assert ratio == pytest.approx((32.8 / 8.19) * (8 / 32))


# ---- DAPO -----------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["8b", "32b"])
def test_dapo_launches_between_the_batch_and_the_stated_multiple(key):
    w = ROSE_WORKLOADS[key]
    cap = math.floor(w.dapo.max_launch_multiple * w.groups)
    launched = [dapo_groups_to_launch(step, 0, key) for step in range(w.steps[Algorithm.DAPO])]
    assert all(w.groups <= n <= cap for n in launched)
    assert max(launched) * w.group <= 5.7 * w.batch  # Fig. 1d
    assert len(set(launched)) > 1  # demand varies across steps
    for step, n in enumerate(launched):
        valid = dapo_valid(step, np.arange(n), 0, key)
        assert valid.sum() >= w.groups or n == cap
        if n < cap:
            assert valid[-1]  # launching stops at the group that completes the batch


def test_dapo_is_deterministic_and_prefix_stable():
    ids = np.arange(40)
    assert np.array_equal(dapo_valid(5, ids, seed=2), dapo_valid(5, ids, seed=2))
    assert np.array_equal(dapo_valid(5, ids[:10], seed=2), dapo_valid(5, ids, seed=2)[:10])
    assert np.array_equal(dapo_valid(5, [7, 3], seed=2), dapo_valid(5, ids, seed=2)[[7, 3]])
    assert not np.array_equal(dapo_valid(5, ids, seed=2), dapo_valid(5, ids, seed=3))
    w = ROSE_WORKLOADS["8b"]
    assert w.dapo_groups(5) == dapo_groups_to_launch(5, w.seed, "8b")


def test_validity_drifts_over_training():
    probs = [group_validity_prob(step) for step in range(50)]
    assert all(0.0 < q < 1.0 for q in probs)
    assert max(probs) - min(probs) > 0.2
    assert group_validity_prob(7, seed=1) == group_validity_prob(7, seed=1)


# ---- spot and serverless --------------------------------------------------------------------
@pytest.mark.parametrize(("key", "top", "changes"), [("8b", 16, 8), ("32b", 32, 10)])
def test_spot_trace_is_piecewise_constant_within_bounds(key, top, changes):
    tr = spot_trace(key, seed=4)
    assert tr == spot_trace(key, seed=4)
    assert tr.max_gpus == top and tr.horizon_s == 7200
    times = [t for t, _ in tr.steps]
    assert times[0] == 0 and times == sorted(set(times))
    assert all(t % tr.slot_s == 0 and t < tr.horizon_s for t in times)
    assert all(0 <= n <= top and n % tr.instance_gpus == 0 for _, n in tr.steps)
    assert len(tr.steps) - 1 == changes
    for (t0, n), (t1, _) in zip(tr.steps, [*tr.steps[1:], (tr.horizon_s, None)], strict=True):
        for t in np.linspace(t0, t1, 7, endpoint=False):
            assert tr.at(float(t)) == n
    slots = tr.slots()
    assert len(slots) == 24 and min(slots) <= 0.25 * top
    assert 0.72 <= tr.mean_fraction <= 0.80
    assert tr.gpus_lost > 0 and tr.recovery.total_s > 0


def test_spot_traces_differ_by_seed():
    assert spot_trace("8b", 0).steps != spot_trace("8b", 1).steps


def test_serverless_lease():
    lease = serverless_lease("8b")
    assert (lease.gpus, lease.lease_s) == (16, 900)
    assert serverless_lease("32b").gpus == 32
    assert lease.expiries(7200) == [900.0 * k for k in range(1, 8)]
    assert lease.cold_start.total_s > 0


# ---- broken contracts -----------------------------------------------------------------------
def test_bad_input_raises_config_error():
    w = ROSE_WORKLOADS["8b"]
    bad = [
        lambda: w.sample(-1),
        lambda: w.sample(0, n_groups=0),
        lambda: _workload("8b", batch=250),
        lambda: _workload("8b", task="webshop"),
        lambda: _workload("8b", model="no-such-model"),
        lambda: _workload("8b", rollout_gpus=6, rollout_tp=4),
        lambda: _workload("8b", steps={Algorithm.GRPO: 10}),
        lambda: train_time_s(w, -1),
        lambda: spot_trace("70b"),
        lambda: serverless_lease("70b"),
        lambda: spot_trace("8b").at(-1.0),
        lambda: serverless_lease("8b").expiries(-1),
        lambda: dapo_valid(0, [-1], seed=0),
        lambda: dapo_valid(-1, [0], seed=0),
        lambda: group_validity_prob(0, workload="70b"),
        lambda: w.dapo.groups_to_launch(0, 0),
    ]
    for call in bad:
        with pytest.raises(ConfigError):
            call()
