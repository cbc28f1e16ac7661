"""Algorithm 1: never admits a layout breaking memory or a worst-case SLO; cheapest choice."""

import dataclasses

import pytest
from factories import job
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from loom.cluster import CLUSTER_POLICIES, ClusterPolicyKind, PolicyConfig
from loom.cluster.group import GroupLayout, Member
from loom.cluster.optimal import OptimalScheduler, pinnings
from loom.cluster.params import testbed as make_testbed
from loom.cluster.rollmux.admission import check_layout, worst_case_periods
from loom.cluster.rollmux.inter import RollMuxScheduler
from loom.cluster.rollmux.placements import generate_placements
from loom.cluster.schedule import run_round_robin, worst_case_times
from loom.core.errors import ConfigError

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


def _simulated_period(layout, migration_s):
    """Worst-case steady-state period by plain simulation, long enough to be periodic."""
    n = len(layout.members)
    if n == 1:
        return layout.members[0].job.solo_s
    sched = run_round_robin(layout, worst_case_times(layout, migration_s), 4 * n + 8, record=False)
    return max(sched.period_s(i, 2 * n + 2) for i in range(n))


@st.composite
def layouts(draw, max_members=4):
    n = draw(st.integers(1, max_members))
    nodes = draw(st.integers(1, 3))
    members = []
    for i in range(n):
        k = draw(st.integers(1, min(2, nodes)))
        pinned = tuple(sorted(draw(st.permutations(range(nodes)))[:k]))
        j = job(
            f"j{i}",
            draw(st.floats(20, 300)),
            draw(st.floats(20, 300)),
            nodes=k,
            slo=draw(st.floats(1.0, 2.5)),
            warm_s=draw(st.sampled_from([0.0, 1.0, 20.0])),
        )
        members.append(Member(job=j, nodes=pinned))
    return GroupLayout(group_id=0, members=tuple(members), rollout_nodes=nodes, train_nodes=2)


@settings(max_examples=300, deadline=None)
@given(layouts(), st.sampled_from([0.0, 2.0]))
def test_admission_shortcuts_are_exact(layout, migration_s):
    """The lower-bound and Theorem 1 shortcuts of `check_layout` never decide otherwise than
    simulating the worst-case round robin (a wrong lower bound rejects feasible layouts)."""
    bound = min(m.job.slo_bound_s for m in layout.members)
    period = _simulated_period(layout, migration_s)
    assert check_layout(layout, 1e9, migration_s).ok == (period <= bound + 1e-9)


def test_a_member_alone_on_its_rollout_nodes_pays_no_rollout_warm_start():
    """Warm starts happen where a node last ran another job; alone on its node a member's
    state stays loaded, so only its training (the pool alternates) pays one."""
    a = job("a", 20, 20, warm_s=20.0)
    b = job("b", 20, 20, warm_s=20.0)
    layout = GroupLayout(
        group_id=0,
        members=(Member(job=a, nodes=(0,)), Member(job=b, nodes=(1,))),
        rollout_nodes=2,
        train_nodes=1,
    )
    period = _simulated_period(layout, 2.0)
    assert period == pytest.approx(80.0)  # the training pool: 2 x (20 + 20 warm)
    assert check_layout(layout, BED.host_memory_gb, 2.0).ok  # bound 2 x 40 = 80


@settings(max_examples=200, deadline=None)
@given(layouts(max_members=3), job_st, st.sampled_from([0.0, 2.0]))
def test_slo_pruned_groups_have_no_feasible_placement(layout, spec, migration_s):
    """The lossless line 4 (`rollmux_slo_prune`) only skips groups no placement of the new
    job could join."""
    assume(layout.slo_saturated)
    (new,) = _jobs([spec])
    new = dataclasses.replace(new, job_id="new")
    for cand in generate_placements(layout, new, 1e9):
        assert not check_layout(cand.layout, 1e9, migration_s).ok


def test_a_group_past_its_natural_cycle_takes_jobs_only_under_slo_pruning():
    """At SLO 2 a group whose training already fills its longest member's solo iteration has
    slack: §4.2's line 4 prunes it (the job gets its own group), the lossless variant scales
    its rollout instead and every member's period stays in SLO."""
    cfg = PolicyConfig(bed=BED, migration_s=2.0)
    pol = RollMuxScheduler(cfg)
    a, b = job("a", 46, 206), job("b", 174, 47)
    g = pol.on_arrival(a, (), 0).layout
    g = pol.on_arrival(b, (g,), 1).layout
    assert len(g.members) == 2 and g.saturated and not g.slo_saturated
    assert pol.on_arrival(job("c", 122, 45), (g,), 1).new_group
    p = RollMuxScheduler(cfg, prune="slo").on_arrival(job("c", 122, 45), (g,), 1)
    assert not p.new_group and p.strategy == "scale"
    assert worst_case_periods(p.layout, 2.0) <= min(m.job.slo_bound_s for m in p.layout.members)


def test_unknown_prune_rule_is_rejected():
    with pytest.raises(ConfigError, match="prune"):
        RollMuxScheduler(PolicyConfig(bed=BED), prune="none")  # type: ignore[arg-type]


def test_a_job_is_fitted_to_a_smaller_training_pool():
    """§4.2 footnote 2: the pool is not scaled; the job's data parallelism is. On half the
    nodes it trains twice as long and caches twice the state per node; its SLO still counts
    from solo execution on its own pools."""
    big = job("b", 100, 100, nodes=1, train_nodes=2, train_mem_gb=300.0, sync_s=10.0)
    fit = big.on_train_pool(1)
    assert (fit.train_nodes, fit.train_s, fit.train_mem_gb, fit.sync_s) == (1, 200.0, 600.0, 10.0)
    assert fit.slo_bound_s == big.slo_bound_s == 2.0 * 210.0
    assert fit.native is big and fit.on_train_pool(2) is big
    assert big.on_train_pool(4) is big, "on a larger pool it keeps its own degree"
    with pytest.raises(ConfigError, match="training pool"):
        big.on_train_pool(0)


def test_rollmux_packs_a_larger_job_into_a_smaller_training_pool():
    pol = RollMuxScheduler(PolicyConfig(bed=BED))
    a = job("a", 200, 40)
    b = job("b", 40, 100, nodes=1, train_nodes=2)  # fitted: 240 s alone, within 2 x 140 s
    pa = pol.on_arrival(a, (), 0)
    pb = pol.on_arrival(b, (pa.layout,), 1)
    assert pb.strategy == "direct" and pb.marginal_cost_h == 0.0
    assert pb.layout.train_nodes == 1
    member = pb.layout.members[-1].job
    assert member.train_nodes == 1 and member.train_s == 200.0 and member.native is b
    # Where the slower training breaks b's own SLO, it gets a group of its own.
    tight = job("t", 40, 100, nodes=1, train_nodes=2, slo=1.2)
    assert pol.on_arrival(tight, (pa.layout,), 1).new_group


def test_opt_fits_larger_members_to_a_smaller_pool_when_cheaper():
    cfg = PolicyConfig(bed=BED, migration_s=2.0)
    a, b = job("a", 200, 40), job("b", 40, 100, nodes=1, train_nodes=2)
    cost, layout = OptimalScheduler(cfg).best_group((a, b))
    assert layout.train_nodes == 1 and cost == BED.cost_per_h(1, 1)
    assert {m.job.native.job_id: m.job.train_nodes for m in layout.members} == {"a": 1, "b": 1}
    # Re-planning from fitted copies starts from the jobs as submitted.
    again = OptimalScheduler(cfg).on_arrival(job("c", 30, 30), (layout,), 1)
    assert all(m.job.native.job_id in "abc" for g in again.layouts for m in g.members)
