"""Co-located (veRL) rollout speed on H800 relative to H20, from the roofline model."""

from dataclasses import replace

import pytest

from loom.cluster.baselines.dedicated import colocated_job
from loom.cluster.colocation import rollout_speed
from loom.cluster.params import noise_model
from loom.sim.workloads.rl_jobs import micro_job


def test_latency_bound_tails_follow_hbm_bandwidth():
    """A few stragglers decode at weight-streaming speed: H800's 3.35 TB/s against H20's 4.0."""
    for model, tp in (("qwen2.5-7b", 1), ("qwen2.5-32b", 2)):
        assert rollout_speed(model, tp, 8192).tail_ratio == pytest.approx(4.0 / 3.35, rel=0.03)


def test_heads_depend_on_what_binds_on_h20():
    """qwen2.5-7b's small KV (4 KV heads) fills H20 with a batch that is compute-bound on its
    148 TFLOPS, so H800 decodes it faster; qwen2.5-14b is bound by KV capacity, where H800's
    80 GB hold fewer sequences than H20's 96 GB."""
    assert rollout_speed("qwen2.5-7b", 1, 8192).head_ratio < 0.7
    assert rollout_speed("qwen2.5-14b", 1, 8192).head_ratio > 1.1


def test_verl_runs_the_rollout_at_h800_speed():
    job = micro_job("type_b", "b", 10)
    share = 1 - noise_model().tail_start_frac
    expected = job.roll_s * rollout_speed("qwen2.5-14b", 1, 8192).time_ratio(share)
    assert job.colocated_roll_s == pytest.approx(expected)
    co = colocated_job(job)
    assert co.roll_s == pytest.approx(expected) and co.sync_s == job.warm_s
    assert colocated_job(replace(job, colocated_roll_s=None)).roll_s == job.roll_s
