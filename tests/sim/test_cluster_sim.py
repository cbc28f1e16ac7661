"""Cluster simulator: every job finishes, no pool double-booked, deterministic, RollMux SLOs."""

import pytest

from loom.cluster import CLUSTER_POLICIES, ClusterPolicyKind, PolicyConfig
from loom.cluster.params import testbed as make_testbed
from loom.sim.cluster import ClusterSimulator
from loom.sim.workloads.rl_jobs import synthetic_philly, table6_jobs

BED = make_testbed()


@pytest.fixture(scope="module")
def jobs():
    return table6_jobs("mixed", synthetic_philly(3, jobs=30), 3)


def run(kind, jobs, seed=3):
    policy = CLUSTER_POLICIES.get(kind)(PolicyConfig(bed=BED, migration_s=2.0, seed=seed))
    return ClusterSimulator(BED, seed=seed).run(policy, jobs)


@pytest.mark.parametrize("kind", list(ClusterPolicyKind))
def test_every_job_finishes_and_costs_add_up(kind, jobs):
    res = run(kind, jobs)
    assert [o.job_id for o in res.outcomes] == sorted(j.job_id for j in jobs)
    assert all(o.finish_s > o.arrival_s for o in res.outcomes)
    assert res.cost_usd > 0
    for pool in ("rollout", "training"):
        assert res.busy_gpu_s[pool] <= res.gpu_s[pool] * (1 + 1e-9), "a GPU was double-booked"


def test_same_seed_same_result(jobs):
    a, b = run(ClusterPolicyKind.ROLLMUX, jobs), run(ClusterPolicyKind.ROLLMUX, jobs)
    assert a.cost_usd == b.cost_usd and a.outcomes == b.outcomes


def test_rollmux_meets_every_slo_and_beats_solo(jobs):
    rm, solo = run(ClusterPolicyKind.ROLLMUX, jobs), run(ClusterPolicyKind.SOLO_D, jobs)
    assert rm.slo_attainment == 1.0
    assert rm.cost_per_h < solo.cost_per_h
