"""Jobs sharing one training node group (PlexRL §4.4, §6.2): one operation at a time, each
job's operations in order, setup exactly where the job changes, the rollout at most one step
stale, every step finished, and the same inputs giving the same run."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.cluster.plexrl import OP_POLICIES
from loom.core.errors import ConfigError
from loom.sim.cluster.plexrl import GroupJob, NodeGroupSimulator

SETUP = 3.0
OPS = (("compute_log_prob", 4.0), ("update_actor", 10.0), ("sync_weight", 2.0))


def setup(job: str, resident: str | None) -> float:
    return SETUP


def jobs_strategy() -> st.SearchStrategy[list[GroupJob]]:
    one = st.tuples(st.floats(1, 60), st.integers(1, 6), st.floats(0, 30))
    return st.lists(one, min_size=1, max_size=4).map(
        lambda raw: [
            GroupJob(job_id=f"j{i}", rollout_s=r, train_ops=OPS, steps=n, arrival_s=a)
            for i, (r, n, a) in enumerate(raw)
        ]
    )


@settings(max_examples=60, deadline=None)
@given(jobs_strategy(), st.sampled_from(["hrrs", "hrrn", "fcfs"]))
def test_one_operation_at_a_time_in_order_with_setup_at_job_changes(jobs, kind) -> None:
    res = NodeGroupSimulator(jobs, OP_POLICIES.get(kind)(), setup).run()
    recs = sorted(res.records, key=lambda r: r.start_s)
    resident = None
    for a, b in itertools.pairwise(recs):
        assert b.start_s - b.setup_s >= a.end_s - 1e-9, "two operations at once"
    for r in recs:
        assert r.setup_s == (SETUP if r.job != resident else 0.0)
        assert r.start_s - r.setup_s >= r.arrival_s - 1e-9
        resident = r.job
    for job in jobs:
        mine = [(r.step, [n for n, _ in OPS].index(r.name)) for r in recs if r.job == job.job_id]
        assert mine == sorted(mine) and len(mine) == job.steps * len(OPS)  # all, in order
        assert len(res.step_end_s[job.job_id]) == job.steps
        # one step stale: rollout k+1 (k >= 1) ends after its rollout time past sync of k-1
        syncs, rolls = res.step_end_s[job.job_id], res.rollout_end_s[job.job_id]
        for k in range(2, job.steps):
            assert rolls[k] - job.rollout_s >= syncs[k - 2] - 1e-9


def test_alone_the_cycle_is_the_rollout_and_the_bubble_is_the_rest() -> None:
    job = GroupJob(job_id="a", rollout_s=100.0, train_ops=OPS, steps=10)
    res = NodeGroupSimulator([job], OP_POLICIES.get("hrrs")(), setup).run()
    assert res.cycle_s("a") == pytest.approx(100.0)
    assert res.switches() == 1  # the first load only


def test_two_jobs_share_the_pool_without_slowing_when_it_has_room() -> None:
    jobs = [GroupJob(job_id=f"j{i}", rollout_s=100.0, train_ops=OPS, steps=10) for i in range(2)]
    res = NodeGroupSimulator(jobs, OP_POLICIES.get("hrrs")(), setup).run()
    assert all(res.cycle_s(j.job_id) == pytest.approx(100.0) for j in jobs)
    # HRRS keeps a job's chain together: two switches per cycle, not one per operation
    fcfs = NodeGroupSimulator(jobs, OP_POLICIES.get("fcfs")(), setup).run()
    assert res.switches() <= fcfs.switches()


def test_a_saturated_pool_slows_its_jobs() -> None:
    heavy = (("update_actor", 60.0),)
    jobs = [GroupJob(job_id=f"j{i}", rollout_s=50.0, train_ops=heavy, steps=8) for i in range(2)]
    res = NodeGroupSimulator(jobs, OP_POLICIES.get("hrrs")(), setup).run()
    assert min(res.cycle_s(j.job_id) for j in jobs) > 100.0  # 2 x (60 + 3) per two cycles


def test_same_inputs_same_run_and_bad_input() -> None:
    jobs = [GroupJob(job_id=f"j{i}", rollout_s=30.0 + i, train_ops=OPS, steps=5) for i in range(3)]
    a = NodeGroupSimulator(jobs, OP_POLICIES.get("hrrs")(), setup).run()
    b = NodeGroupSimulator(jobs, OP_POLICIES.get("hrrs")(), setup).run()
    assert a.records == b.records
    with pytest.raises(ConfigError, match="unique"):
        NodeGroupSimulator([jobs[0], jobs[0]], OP_POLICIES.get("hrrs")(), setup)
    with pytest.raises(ConfigError, match="step"):
        GroupJob(job_id="x", rollout_s=1.0, train_ops=OPS, steps=0)
