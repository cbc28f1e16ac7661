"""Algorithm 1: never admits a layout breaking memory or a worst-case SLO; cheapest choice."""

from factories import job
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.cluster import CLUSTER_POLICIES, ClusterPolicyKind, PolicyConfig
from loom.cluster.optimal import OptimalScheduler, pinnings
from loom.cluster.params import testbed as make_testbed
from loom.cluster.rollmux.admission import check_layout, worst_case_periods
from loom.cluster.rollmux.inter import RollMuxScheduler

BED = make_testbed()

job_st = st.tuples(
    st.floats(20, 600),
    st.floats(20, 600),
    st.sampled_from([1, 2]),
    st.floats(1.0, 2.0),
    st.floats(100, 900),
    st.floats(100, 900),
)


def _jobs(specs):
    return [
        job(f"j{i}", r, t, nodes=k, slo=slo, rollout_mem_gb=rm, train_mem_gb=tm, warm_s=1.0)
        for i, (r, t, k, slo, rm, tm) in enumerate(specs)
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(job_st, min_size=1, max_size=14), st.integers(2, 5))
def test_rollmux_never_breaks_memory_or_slo(specs, max_size):
    policy = RollMuxScheduler(PolicyConfig(bed=BED, max_group_size=max_size, migration_s=2.0))
    groups = {}
    for j in _jobs(specs):
        p = policy.on_arrival(j, tuple(groups.values()), len(groups))
        groups[p.layout.group_id] = p.layout
        layout = p.layout
        assert len(layout.members) <= max_size
        assert layout.fits_memory(BED.host_memory_gb)
        period = worst_case_periods(layout, 2.0 if len(layout.members) > 1 else 0.0)
        for m in layout.members:
            assert period <= m.job.slo_bound_s + 1e-6, (m.job.job_id, period)
    assert sum(len(g.members) for g in groups.values()) == len(specs), "nothing lost"


def test_direct_packing_of_complementary_jobs_costs_nothing():
    pol = RollMuxScheduler(PolicyConfig(bed=BED))
    a, b = job("a", 100, 100), job("b", 100, 100)
    pa = pol.on_arrival(a, (), 0)
    assert pa.new_group and pa.strategy == "isolated"
    pb = pol.on_arrival(b, (pa.layout,), 1)
    assert pb.strategy == "direct" and pb.marginal_cost_h == 0.0


def test_rollout_heavy_jobs_scale_the_rollout_pool():
    pol = RollMuxScheduler(PolicyConfig(bed=BED))
    a, b = job("a", 250, 100, slo=1.2), job("b", 250, 100, slo=1.2)
    pa = pol.on_arrival(a, (), 0)
    pb = pol.on_arrival(b, (pa.layout,), 1)
    assert pb.strategy == "scale"
    assert pb.marginal_cost_h == BED.rollout_node_price_h
    assert pb.layout.rollout_nodes == 2 and pb.layout.train_nodes == 1


def test_memory_residency_blocks_packing():
    pol = RollMuxScheduler(PolicyConfig(bed=BED))
    a = job("a", 100, 100, train_mem_gb=1500.0)
    b = job("b", 100, 100, train_mem_gb=1000.0)
    pa = pol.on_arrival(a, (), 0)
    assert pol.on_arrival(b, (pa.layout,), 1).new_group
    assert not check_layout(
        pa.layout.with_member(pa.layout.members[0].__class__(job=b, nodes=(0,)), 1),
        BED.host_memory_gb,
    ).ok


def test_pinnings_enumerate_up_to_relabeling():
    assert sorted(u for _a, u in pinnings([1, 1])) == [1, 2]
    assert len(list(pinnings([1, 1, 1]))) == 5  # Bell(3)


@settings(max_examples=15, deadline=None)
@given(st.lists(job_st, min_size=1, max_size=6))
def test_opt_is_never_worse_than_rollmux(specs):
    cfg = PolicyConfig(bed=BED, migration_s=2.0)
    jobs = _jobs(specs)
    rm = RollMuxScheduler(cfg)
    groups = {}
    for j in jobs:
        p = rm.on_arrival(j, tuple(groups.values()), len(groups))
        groups[p.layout.group_id] = p.layout
    opt = OptimalScheduler(cfg).solve(jobs)
    assert sorted(j for g in opt for j in g.job_ids) == sorted(j.job_id for j in jobs)
    cost = lambda gs: sum(g.cost_per_h(BED) for g in gs)  # noqa: E731
    assert cost(opt) <= cost(groups.values()) + 1e-6
    for g in opt:
        assert check_layout(g, BED.host_memory_gb, 2.0 if len(g.members) > 1 else 0.0).ok


def test_registry_has_every_policy():
    assert set(CLUSTER_POLICIES.names()) == {k.value for k in ClusterPolicyKind}


def test_ties_in_marginal_cost_go_to_the_first_group():
    """Algorithm 1 updates its record only on a strictly lower cost: among zero-cost packings the
    first group in creation order wins, not the one it would leave busiest."""
    pol = RollMuxScheduler(PolicyConfig(bed=BED))
    g0 = pol.on_arrival(job("a", 200, 200), (), 0).layout
    g1 = pol.on_arrival(job("b", 140, 140), (), 1).layout
    p = pol.on_arrival(job("c", 150, 150), (g0, g1), 2)  # g1 would be left busier
    assert p.strategy == "direct" and p.layout.group_id == 0


def test_opt_replans_on_arrivals_only_unless_asked():
    cfg = PolicyConfig(bed=BED)
    a, b = job("a", 100, 100), job("b", 100, 100)
    plan = OptimalScheduler(cfg).on_arrival(b, (OptimalScheduler(cfg).solve([a])[0],), 1)
    assert len(plan.layouts) == 1 and set(plan.layouts[0].job_ids) == {"a", "b"}
    assert OptimalScheduler(cfg).regroup(plan.layouts, 2) is None
    again = OptimalScheduler(cfg, regroup_on_departure=True).regroup(plan.layouts, 2)
    assert again is not None and sum(len(g.members) for g in again.layouts) == 2
