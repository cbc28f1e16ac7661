"""Heddle placement: the exact fast solver and the Formula 3 reference against brute force."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.rollout.heddle.placement import (
    Placement,
    PresortedPlacer,
    WorkerCost,
    aggregate_short,
    presorted_dp,
    presorted_dp_hetero,
    presorted_dp_reference,
)

Factors = list[float]  # factors[s] = F(s); index 0 unused

# ---------------------------------------------------------------------------------------------
# Factories and brute force


def group_cost(lengths: Sequence[float], group: Sequence[int], t: float, f: Factors) -> float:
    """Formula 2's cost of one group, with the documented evaluation order."""
    return max(lengths[i] for i in group) * t * f[len(group)] if group else 0.0


def formula2(lengths: Sequence[float], groups: Sequence[Sequence[int]], t: float, f: Factors):
    return max((group_cost(lengths, g, t, f) for g in groups), default=0.0)


def set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first], *part]
        for k in range(len(part)):
            yield [*part[:k], [first, *part[k]], *part[k + 1 :]]


def brute_force(lengths: Sequence[float], m: int, t: float, f: Factors) -> float:
    return min(
        formula2(lengths, p, t, f) for p in set_partitions(list(range(len(lengths)))) if len(p) <= m
    )


def check_invariants(p: Placement, lengths: Sequence[float], max_groups: int) -> None:
    flat = sorted(i for g in p.groups for i in g)
    assert flat == list(range(len(lengths))), "each index exactly once"
    assert sum(1 for g in p.groups if g) <= max_groups
    assert len(p.group_makespans) == len(p.groups)
    for j, g in enumerate(p.groups):
        assert all(p.assignment[i] == j for i in g)
    nonempty = [g for g in p.groups if g]
    for a, b in itertools.pairwise(nonempty):  # contiguous, longest first
        assert min(lengths[i] for i in a) >= max(lengths[i] for i in b)


def as_form(factors: Factors, form: str):
    """The same interference as a list, array, mapping or callable."""
    if form == "array":
        return np.asarray(factors)
    if form == "mapping":
        return {s: factors[s] for s in range(1, len(factors))}
    if form == "callable":
        return lambda s: factors[s]
    return factors


lengths_st = st.lists(
    st.one_of(st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0]), st.floats(0, 1e4)), max_size=7
)


@st.composite
def factors_st(draw: st.DrawFn, n: int) -> Factors:
    """Non-decreasing factors for sizes 1..n: flat, gentle or steep."""
    base = draw(st.floats(0.1, 10))
    step = draw(st.sampled_from([0.0, 0.01, 0.5, 5.0]))
    incs = draw(st.lists(st.floats(0, 1), min_size=n, max_size=n))
    vals = np.cumsum([base] + [step * x for x in incs[1:]]).tolist() if n else []
    return [-1.0, *vals]  # index 0 is unused; a negative value proves it


# ---------------------------------------------------------------------------------------------
# Homogeneous: exactness


@settings(max_examples=300, deadline=None)
@given(data=st.data(), lengths=lengths_st, m=st.integers(1, 9), t=st.floats(0.01, 100))
def test_fast_and_reference_equal_brute_force(data, lengths, m, t):
    f = data.draw(factors_st(len(lengths)))
    form = data.draw(st.sampled_from(["list", "array", "mapping", "callable"]))
    best = brute_force(lengths, m, t, f)
    fast = presorted_dp(lengths, m, as_form(f, form), t)
    ref = presorted_dp_reference(lengths, m, as_form(f, form), t)
    assert fast.makespan == best
    assert ref.makespan == best
    for p in (fast, ref):
        check_invariants(p, lengths, m)
        assert formula2(lengths, p.groups, t, f) == p.makespan


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    lengths=st.lists(st.integers(0, 50).map(float), max_size=40),
    m=st.integers(1, 8),
)
def test_fast_equals_reference_on_larger_inputs(data, lengths, m):
    f = data.draw(factors_st(len(lengths)))
    fast = presorted_dp(lengths, m, f)
    ref = presorted_dp_reference(lengths, m, f)
    assert fast.makespan == ref.makespan
    check_invariants(fast, lengths, m)
    assert formula2(lengths, fast.groups, 1.0, f) == fast.makespan


def test_lognormal_instance_matches_reference():
    lengths = np.random.default_rng(7).lognormal(6, 1, 300)
    f = [0.0, *(1 + 0.01 * k for k in range(1, 301))]
    fast = presorted_dp(lengths, 16, f, 0.02)
    assert fast.makespan == presorted_dp_reference(lengths, 16, f, 0.02).makespan
    check_invariants(fast, list(lengths), 16)
    assert formula2(list(lengths), fast.groups, 0.02, f) == fast.makespan


def test_empty_lengths():
    p = presorted_dp([], 4, lambda s: 1.0)
    assert p.makespan == 0.0 and p.groups == () and p.assignment == ()
    assert presorted_dp_reference([], 4, lambda s: 1.0).groups == ()


def test_group_zero_holds_longest_and_sizes():
    p = presorted_dp([1.0, 9.0, 2.0, 8.0], 2, lambda s: float(s))
    assert p.groups[0][0] == 1
    assert p.sizes == tuple(len(g) for g in p.groups)
    assert p.num_items == 4


def test_more_workers_than_items_gives_singletons_under_steep_interference():
    p = presorted_dp([3.0, 1.0, 2.0], 10, lambda s: 10.0**s)
    assert sorted(p.groups) == [(0,), (1,), (2,)]
    assert p.makespan == 30.0


def test_flat_interference_puts_everything_together():
    p = presorted_dp([3.0, 1.0, 2.0], 3, lambda s: 1.0)
    assert p.makespan == 3.0


# ---------------------------------------------------------------------------------------------
# Heterogeneous workers


def compositions(n: int, m: int) -> Iterator[list[int]]:
    """Ordered sizes (possibly zero) of m contiguous groups covering n items."""
    for cuts in itertools.combinations_with_replacement(range(n + 1), m - 1):
        bounds = [0, *cuts, n]
        yield [b - a for a, b in itertools.pairwise(bounds)]


def hetero_cost(lengths, groups, workers: list[tuple[float, Factors]]) -> float:
    return max(group_cost(lengths, g, t, f) for g, (t, f) in zip(groups, workers, strict=True))


def brute_force_ordered(lengths, workers) -> float:
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    best = math.inf
    for sizes in compositions(len(lengths), len(workers)):
        cut = np.cumsum([0, *sizes])
        groups = [order[a:b] for a, b in itertools.pairwise(cut)]
        best = min(best, hetero_cost(lengths, groups, workers))
    return best


def brute_force_any(lengths, workers) -> float:
    best = math.inf
    for assign in itertools.product(range(len(workers)), repeat=len(lengths)):
        groups = [[i for i, a in enumerate(assign) if a == j] for j in range(len(workers))]
        best = min(best, hetero_cost(lengths, groups, workers))
    return best


@st.composite
def workers_st(draw: st.DrawFn, n: int) -> list[tuple[float, Factors]]:
    k = draw(st.integers(1, 4))
    return [(draw(st.floats(0.1, 10)), draw(factors_st(n))) for _ in range(k)]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), lengths=st.lists(st.sampled_from([0.0, 1.0, 2.0, 4.0, 7.5]), max_size=6))
def test_hetero_equals_brute_force_in_worker_order(data, lengths):
    spec = data.draw(workers_st(len(lengths)))
    workers = [WorkerCost(t, f) for t, f in spec]
    p = presorted_dp_hetero(lengths, workers)
    assert len(p.groups) == len(workers)
    check_invariants(p, lengths, len(workers))
    assert p.makespan == hetero_cost(lengths, p.groups, spec)
    assert p.makespan == brute_force_ordered(lengths, spec)
    assert p.makespan >= brute_force_any(lengths, spec)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), lengths=st.lists(st.floats(0, 100), max_size=6), m=st.integers(1, 3))
def test_hetero_with_identical_workers_is_globally_optimal(data, lengths, m):
    t, f = data.draw(st.floats(0.1, 10)), data.draw(factors_st(len(lengths)))
    worker = WorkerCost(t, f)
    p = presorted_dp_hetero(lengths, [worker] * m)
    assert p.makespan == brute_force_any(lengths, [(t, f)] * m)
    assert p.makespan == presorted_dp(lengths, m, f, t).makespan


def test_fixed_worker_order_can_miss_the_global_optimum():
    # The Heddle mapping gives the longest group to worker 0; here the slower worker 1 should
    # take the single longest trajectory instead (18 < 20).
    linear = [0.0, 1.0, 2.0, 3.0, 4.0]
    spec = [(1.0, linear), (1.5, linear)]
    lengths = [10.0, 6.0, 6.0, 6.0]
    p = presorted_dp_hetero(lengths, [WorkerCost(t, f) for t, f in spec])
    assert p.makespan == 20.0 == brute_force_ordered(lengths, spec)
    assert brute_force_any(lengths, spec) == 18.0


def test_hetero_may_leave_a_slow_worker_empty():
    p = presorted_dp_hetero([5.0, 4.0], [WorkerCost(100.0, [0, 1, 1]), WorkerCost(1.0, [0, 1, 1])])
    assert p.groups == ((), (0, 1)) and p.group_makespans == (0.0, 5.0)


def test_placer_reuses_tables_and_is_deterministic():
    placer = PresortedPlacer([3.0, 1.0, 2.0])
    w = WorkerCost(1.0, lambda s: 1.0 + s)
    assert placer.solve([w, w]) == placer.solve([w, w])
    assert placer.order == (0, 2, 1)


# ---------------------------------------------------------------------------------------------
# Aggregation of short trajectories


def test_aggregation_threshold_zero_is_a_no_op():
    lengths = [5.0, 0.0, 3.0, 0.0, 1.0]
    blocks = aggregate_short(lengths, 0.0)
    assert blocks.counts == (1,) * 5 and blocks.order == (0, 2, 4, 1, 3)
    f = [0.0, 1.0, 1.5, 2.0, 2.5, 3.0]
    plain = presorted_dp_reference(lengths, 2, f)
    assert presorted_dp_reference(lengths, 2, f, aggregate_below=0.0) == plain


def test_aggregation_blocks_sum_to_at_most_threshold():
    blocks = aggregate_short([9.0, 1.0, 2.0, 3.0, 1.0, 1.0], 4.0)
    # sorted: 9 | 3 (3 + 2 > 4) | 2 + 1 + 1 = 4 | 1
    assert blocks.counts == (1, 1, 3, 1)
    assert blocks.lengths == (9.0, 3.0, 2.0, 1.0)
    assert [blocks.members(b) for b in range(4)] == [(0,), (3,), (2, 1, 4), (5,)]


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    lengths=st.lists(st.floats(0, 100), max_size=25),
    m=st.integers(1, 5),
    threshold=st.floats(0, 150),
)
def test_aggregation_never_beats_the_optimum(data, lengths, m, threshold):
    f = data.draw(factors_st(len(lengths)))
    agg = presorted_dp_reference(lengths, m, f, aggregate_below=threshold)
    check_invariants(agg, lengths, m)
    assert agg.makespan == formula2(lengths, agg.groups, 1.0, f)
    assert agg.makespan >= presorted_dp(lengths, m, f).makespan


# ---------------------------------------------------------------------------------------------
# Contract violations


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"interference": [0, 1.0, 2.0, 1.5]}, r"non-decreasing.*F\(3\)"),
        ({"interference": {1: 1.0, 2: 0.5, 3: 2.0}}, r"non-decreasing.*F\(2\)"),
        ({"interference": lambda s: math.nan if s == 2 else 1.0}, "group size 2"),
        ({"interference": [0, 1.0, 0.0, 1.0]}, "group size 2"),
        ({"interference": [0, -1.0, 1.0, 1.0]}, "group size 1"),
        ({"interference": {1: 1.0, 2: 1.0}}, "no factor for group size 3"),
        ({"interference": [0, 1.0, 1.0]}, "sizes 1..3"),
        ({"lengths": [1.0, -2.0, 3.0]}, r"lengths\[1\]"),
        ({"lengths": [1.0, 2.0, math.nan]}, r"lengths\[2\]"),
        ({"lengths": [math.inf, 2.0, 1.0]}, r"lengths\[0\]"),
        ({"num_workers": 0}, "num_workers must be >= 1"),
        ({"num_workers": 1.5}, "num_workers must be an integer"),
        ({"token_time": 0.0}, "token_time"),
        ({"token_time": math.nan}, "token_time"),
    ],
)
@pytest.mark.parametrize("solver", [presorted_dp, presorted_dp_reference])
def test_bad_input_raises_config_error(solver: Callable[..., Placement], kwargs, match):
    args = {"lengths": [1.0, 2.0, 3.0], "num_workers": 2, "interference": [0, 1.0, 1.0, 1.0]}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        solver(**args)


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError, match="non-decreasing"):
        presorted_dp([1.0, 2.0], 1, [0, 2.0, 1.0])


def test_hetero_bad_workers():
    with pytest.raises(ConfigError, match="at least one worker"):
        presorted_dp_hetero([1.0], [])
    with pytest.raises(ConfigError, match="WorkerCost"):
        presorted_dp_hetero([1.0], [(1.0, [0, 1.0])])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="token_time"):
        WorkerCost(-1.0, [0, 1.0])


def test_bad_aggregation_threshold():
    with pytest.raises(ConfigError, match="threshold"):
        aggregate_short([1.0], -1.0)
