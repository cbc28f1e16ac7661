"""Operation scheduling on a node group (§4.4): HRRS's priority and plan invariants, setup
charged exactly at job changes, no starvation, Algorithm 1's literal reading where it differs,
and the dynamic-programming optimum against brute force and the heuristics."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.cluster.plexrl import OP_POLICIES, Op, OpPolicyKind, Plan, optimal_plan, total_flow_s
from loom.cluster.plexrl.hrrs import brute_force_plan
from loom.core.errors import ConfigError, UnknownPolicyError

SETUP = 5.0


def setup(job: str, resident: str | None) -> float:
    return SETUP


def ops_strategy(max_jobs: int = 3, max_ops: int = 12) -> st.SearchStrategy[list[Op]]:
    one = st.tuples(st.integers(0, max_jobs - 1), st.floats(0, 30), st.floats(0.5, 20))
    return st.lists(one, min_size=1, max_size=max_ops).map(_ops)


def _ops(raw: Sequence[tuple[int, float, float]]) -> list[Op]:
    seq: dict[str, int] = {}
    out = []
    for i, (j, arrival, exec_s) in enumerate(sorted(raw, key=lambda r: r[1])):
        job = f"j{j}"
        out.append(Op(i, job, round(arrival, 3), round(exec_s, 3), seq.get(job, 0)))
        seq[job] = seq.get(job, 0) + 1
    return out


def check_plan(plan: Plan, ops: Sequence[Op], now: float, busy_until: float, resident) -> None:
    """Disjoint, each job in its order, nothing before its arrival, every op once, setup
    exactly where the job changes."""
    assert sorted(plan.order()) == sorted(o.op_id for o in ops)
    t, res = max(now, busy_until), resident
    last_seq: dict[str, int] = {}
    for p in plan.entries:
        assert p.start_s - p.setup_s >= t - 1e-9, "overlapping entries"
        assert p.start_s - p.setup_s >= p.op.arrival_s - 1e-9 or p.start_s >= p.op.arrival_s
        assert p.op.seq > last_seq.get(p.op.job, -1), "a job's operations out of order"
        last_seq[p.op.job] = p.op.seq
        assert p.setup_s == (SETUP if p.op.job != res else 0.0), "setup not at a job change"
        assert abs(p.end_s - p.start_s - p.op.exec_s) < 1e-9
        t, res = p.end_s, p.op.job


@settings(max_examples=60, deadline=None)
@given(
    ops_strategy(),
    st.sampled_from(["hrrs", "hrrn", "fcfs", "round_robin"]),
    st.sampled_from([None, "j0", "j1"]),
)
def test_plans_are_disjoint_ordered_and_charge_setup_at_job_changes(ops, kind, resident) -> None:
    plan = OP_POLICIES.get(kind)().plan(
        ops, now=0.0, resident=resident, busy_until=2.0, setup=setup
    )
    check_plan(plan, ops, 0.0, 2.0, resident)


def test_hrrs_priority_is_at_least_one_and_follows_eq_4() -> None:
    # at t=10: a (resident job, E=10, waited 10) has P = 2; b (switch, E=5, waited 10) has
    # P = 1 + 10/(5+5) = 2; c (switch, E=1, waited 4): 1 + 4/6
    ops = [Op(0, "a", 0.0, 10.0), Op(1, "b", 0.0, 5.0), Op(2, "c", 6.0, 1.0)]
    plan = OP_POLICIES.get("hrrs")().plan(ops, now=10.0, resident="a", busy_until=10.0, setup=setup)
    assert plan.order()[0] == 0  # tie at P = 2: the earlier arrival (then the lower id)
    # HRRN ignores the switch: c has 1 + 4/1 = 5 (b: 3, a: 2) and goes first
    hrrn = OP_POLICIES.get("hrrn")().plan(ops, now=10.0, resident="a", busy_until=10.0, setup=setup)
    assert hrrn.order()[0] == 2


def test_hrrs_batches_the_resident_job_where_hrrn_switches() -> None:
    # a stream of short same-job ops and one other job's op: HRRS amortises the setup
    ops = [Op(i, "a" if i % 2 == 0 else "b", float(i), 2.0, i // 2) for i in range(8)]
    hrrs = OP_POLICIES.get("hrrs")().plan(ops, now=8.0, resident="a", busy_until=8.0, setup=setup)
    hrrn = OP_POLICIES.get("hrrn")().plan(ops, now=8.0, resident="a", busy_until=8.0, setup=setup)
    switches = lambda p: sum(1 for e in p.entries if e.setup_s > 0)  # noqa: E731
    assert switches(hrrs) <= switches(hrrn)
    assert total_flow_s(hrrs) <= total_flow_s(hrrn)


def test_no_starvation_under_a_stream_of_short_same_job_operations() -> None:
    """Job b's one operation waits behind a's stream; its response ratio grows with its wait
    and it runs within a bounded time."""
    ops = [Op(0, "b", 0.0, 10.0)]
    ops += [Op(i, "a", float(i), 1.0, i) for i in range(1, 400)]
    plan = OP_POLICIES.get("hrrs")().plan(ops, now=0.0, resident="a", busy_until=0.0, setup=setup)
    b = next(p for p in plan.entries if p.op.job == "b")
    # b's P reaches the a-stream's (≈ 1 + small wait) after waiting ~ its own service time
    assert b.start_s < 60.0


def test_algorithm_1_read_literally_differs_from_eq_3() -> None:
    ops = [Op(0, "a", 0.0, 10.0), Op(1, "a", 0.0, 10.0, 1)]
    alg1 = OP_POLICIES.get("hrrs_alg1")().plan(
        ops, now=0.0, resident="a", busy_until=0.0, setup=setup
    )
    hrrs = OP_POLICIES.get("hrrs")().plan(ops, now=0.0, resident="a", busy_until=0.0, setup=setup)
    # Eq. 3: the job is resident, no setup; Algorithm 1: the setup on the cursor (line 17) and
    # in every t_req (line 8), so each op's slot is E + setup and the first pays it twice
    assert [p.setup_s for p in hrrs.entries] == [0.0, 0.0] and hrrs.entries[-1].end_s == 20.0
    assert alg1.entries[0].start_s == SETUP and alg1.entries[0].end_s == SETUP + 10 + SETUP
    assert alg1.entries[-1].end_s == 2 * (10 + SETUP) + SETUP
    # and it stops a running operation that is not ranked first
    running = Op(9, "c", 0.0, 100.0)
    short = [Op(10, "a", 0.0, 1.0)]
    stopped = OP_POLICIES.get("hrrs_alg1")().plan(
        short, now=50.0, resident="c", busy_until=100.0, setup=setup, running=running
    )
    assert stopped.entries[0].op.op_id == 10 and stopped.entries[0].stops_running


@settings(max_examples=40, deadline=None)
@given(ops_strategy(max_jobs=3, max_ops=6), st.sampled_from([None, "j0"]))
def test_the_dp_optimum_equals_brute_force_and_bounds_every_heuristic(ops, resident) -> None:
    kw = {"now": 0.0, "resident": resident, "busy_until": 1.0, "setup": setup}
    best = optimal_plan(ops, **kw)
    check_plan(best, ops, 0.0, 1.0, resident)
    assert total_flow_s(best) == pytest.approx(total_flow_s(brute_force_plan(ops, **kw)))
    for kind in ("hrrs", "hrrn", "fcfs", "round_robin"):
        heuristic = OP_POLICIES.get(kind)().plan(ops, **kw)
        assert total_flow_s(best) <= total_flow_s(heuristic) + 1e-9


def test_registry_and_bad_input() -> None:
    assert set(OpPolicyKind) == {"hrrs", "hrrs_alg1", "hrrn", "fcfs", "round_robin"}
    with pytest.raises(UnknownPolicyError):
        OP_POLICIES.get("sjf")
    with pytest.raises(ConfigError, match="exec_s"):
        Op(0, "a", 0.0, -1.0)
    with pytest.raises(ConfigError, match="small instances"):
        optimal_plan(
            [Op(i, "a", 0.0, 1.0, i) for i in range(17)],
            now=0.0,
            resident=None,
            busy_until=0.0,
            setup=setup,
        )


def test_the_same_inputs_give_the_same_order() -> None:
    ops = _ops([(i % 3, float(i % 5), 1.0 + i % 4) for i in range(12)])
    a = OP_POLICIES.get("hrrs")().plan(ops, now=0.0, resident=None, busy_until=0.0, setup=setup)
    b = OP_POLICIES.get("hrrs")().plan(
        list(reversed(ops)), now=0.0, resident=None, busy_until=0.0, setup=setup
    )
    assert a.order() == b.order()


def test_round_robin_gives_each_job_its_turn_in_a_fixed_cycle() -> None:
    ops = [Op(i, job, 0.0, 1.0, i // 3) for i, job in enumerate(["a", "b", "c"] * 2)]
    plan = OP_POLICIES.get("round_robin")().plan(
        ops, now=0.0, resident="b", busy_until=0.0, setup=setup
    )
    # b is resident: its ready operations run back to back, then c, then a
    assert [p.op.job for p in plan.entries] == ["b", "b", "c", "c", "a", "a"]
    assert sum(1 for p in plan.entries if p.setup_s) == 2
