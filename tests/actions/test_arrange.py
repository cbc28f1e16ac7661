"""DPArrange: the unit pool and GPU chunk operators against brute force on small instances."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.actions.tangram import (
    Arrangement,
    ChunkOperator,
    DpOperator,
    UnitPoolOperator,
    dp_arrange,
    dp_arrange_chunks,
    free_blocks,
    pack_chunks,
)
from loom.actions.tangram.arrange import PrefixArrangements, UnitDurations
from loom.core.errors import ConfigError

Task = dict[int, float]

# ---------------------------------------------------------------------------------------------
# Factories and brute force


def chosen_total(durations: Sequence[Mapping[int, float]], units: Sequence[int]) -> float:
    """The sum of the chosen durations, added in task order like the DP adds them."""
    total = 0.0
    for task, k in zip(durations, units, strict=True):
        total += task[k]
    return total


def brute_force(
    durations: Sequence[Mapping[int, float]], fits: Callable[[tuple[int, ...]], bool]
) -> tuple[float, list[tuple[int, ...]]] | None:
    """Least total over every choice that fits, and every choice attaining it."""
    best: float | None = None
    argbest: list[tuple[int, ...]] = []
    for units in itertools.product(*(sorted(t) for t in durations)):
        if not fits(units):
            continue
        total = chosen_total(durations, units)
        if best is None or total < best:
            best, argbest = total, [units]
        elif total == best:
            argbest.append(units)
    return None if best is None else (best, argbest)


def place(sizes: Sequence[int], gpus: int, occupied: Collection[int]) -> bool:
    """Explicit search: every chunk at some aligned offset, none overlapping or busy."""
    used = [g in occupied for g in range(gpus)]

    def go(i: int) -> bool:
        if i == len(sizes):
            return True
        s = sizes[i]
        for start in range(0, gpus, s):
            if not any(used[start : start + s]):
                used[start : start + s] = [True] * s
                if go(i + 1):
                    return True
                used[start : start + s] = [False] * s
        return False

    return go(0)


def place_on_nodes(sizes: Sequence[int], gpus: int, busy: Sequence[Collection[int]]) -> bool:
    """Explicit search over which node takes each chunk, then aligned placement per node."""
    for nodes in itertools.product(range(len(busy)), repeat=len(sizes)):
        if all(
            place([s for s, n in zip(sizes, nodes, strict=True) if n == node], gpus, busy[node])
            for node in range(len(busy))
        ):
            return True
    return False


def reference_dp(durations: Sequence[Mapping[int, float]], budget: int) -> float | None:
    """A plain Python "exactly j units" DP, minimised over every j at the end."""
    best = {0: 0.0}
    for task in durations:
        nxt: dict[int, float] = {}
        for j, total in best.items():
            for k, d in task.items():
                if j + k <= budget and total + d < nxt.get(j + k, math.inf):
                    nxt[j + k] = total + d
        best = nxt
    return min(best.values(), default=None)


def check_arrangement(
    result: Arrangement | None,
    durations: Sequence[Mapping[int, float]],
    expected: tuple[float, list[tuple[int, ...]]] | None,
) -> None:
    if expected is None:
        assert result is None
        return
    assert result is not None
    best, argbest = expected
    assert result.total == best, "the optimum, to the last bit"
    assert result.units in argbest, "a feasible choice that attains it"
    assert chosen_total(durations, result.units) == result.total
    assert sum(result.units) == min(sum(u) for u in argbest), "ties go to fewer units"


unit_tasks = st.lists(
    st.dictionaries(
        st.integers(1, 8),
        st.one_of(st.integers(0, 6).map(float), st.floats(0, 100, allow_nan=False)),
        min_size=1,
        max_size=4,
    ),
    max_size=5,
)

# ---------------------------------------------------------------------------------------------
# Unit pool


@settings(max_examples=400, deadline=None)
@given(durations=unit_tasks, budget=st.integers(0, 30))
def test_dp_arrange_matches_brute_force(durations: list[Task], budget: int) -> None:
    def fits(units: tuple[int, ...]) -> bool:
        return sum(units) <= budget

    expected = brute_force(durations, fits)
    check_arrangement(dp_arrange(durations, budget), durations, expected)


@settings(max_examples=60, deadline=None)
@given(
    durations=st.lists(
        st.dictionaries(st.integers(1, 12), st.floats(0, 50), min_size=1, max_size=6),
        min_size=6,
        max_size=20,
    ),
    budget=st.integers(0, 120),
)
def test_dp_arrange_matches_reference_dp_on_larger_instances(
    durations: list[Task], budget: int
) -> None:
    result = dp_arrange(durations, budget)
    expected = reference_dp(durations, budget)
    if expected is None:
        assert result is None
        return
    assert result is not None
    assert result.total == expected
    assert sum(result.units) <= budget
    assert chosen_total(durations, result.units) == result.total


def test_slower_with_more_units_takes_fewer() -> None:
    # Growing durations: an "exactly the budget" answer would pick 5 + 5 units.
    durations = [{1: 1.0, 5: 10.0}, {1: 2.0, 5: 0.5}]
    assert dp_arrange(durations, 10) == Arrangement(total=1.5, units=(1, 5))


def test_budget_need_not_be_used_up() -> None:
    durations = [{2: 1.0, 3: 4.0}, {1: 3.0, 4: 3.0}]
    assert dp_arrange(durations, 7) == Arrangement(total=4.0, units=(2, 1))


def test_ties_prefer_fewer_units() -> None:
    durations = [{1: 2.0, 2: 2.0, 4: 2.0}, {3: 1.0, 6: 1.0}]
    assert dp_arrange(durations, 10) == Arrangement(total=3.0, units=(1, 3))


def test_infeasible_and_empty() -> None:
    assert dp_arrange([{2: 1.0}, {3: 1.0, 4: 0.5}], 4) is None
    assert dp_arrange([{1: 1.0}], 0) is None
    assert dp_arrange([], 0) == Arrangement(total=0.0, units=())
    assert dp_arrange([], 5) == Arrangement(total=0.0, units=())


def test_option_order_and_options_above_budget_do_not_matter() -> None:
    forward = [{1: 5.0, 2: 3.0, 40: 0.0}, {1: 4.0, 3: 1.0}]
    backward = [dict(reversed(list(t.items()))) for t in forward]
    assert dp_arrange(forward, 5) == dp_arrange(backward, 5) == Arrangement(total=4.0, units=(2, 3))


def test_deterministic() -> None:
    durations = [{k: 1.0 / k + 0.1 * (k % 3) for k in range(1, 9)} for _ in range(10)]
    assert len({dp_arrange(durations, 30) for _ in range(3)}) == 1


@pytest.mark.parametrize(
    ("durations", "units", "message"),
    [
        ([{1: -1.0}], 4, "finite and >= 0"),
        ([{1: math.nan}], 4, "finite and >= 0"),
        ([{1: math.inf}], 4, "finite and >= 0"),
        ([{1: 1.0}, {0: 1.0}], 4, "task 1: unit counts must be integers >= 1"),
        ([{-2: 1.0}], 4, "integers >= 1"),
        ([{1.5: 1.0}], 4, "integers >= 1"),
        ([{True: 1.0}], 4, "integers >= 1"),
        ([{1: 1.0}, {}], 4, "task 1 lists no unit counts"),
        ([{1: 1.0}], -1, "unit budget must be an integer >= 0"),
        ([{1: 1.0}], 2.0, "unit budget must be an integer >= 0"),
    ],
)
def test_dp_arrange_rejects_bad_input(durations: list[Task], units: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        dp_arrange(durations, units)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        dp_arrange([{1: -1.0}], 1)


# ---------------------------------------------------------------------------------------------
# GPU chunks


@st.composite
def chunk_instances(draw: st.DrawFn) -> tuple[list[Task], int, frozenset[int]]:
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    occupied = draw(st.frozensets(st.integers(0, gpus - 1)))
    powers = [1 << p for p in range(gpus.bit_length())]
    durations = draw(
        st.lists(
            st.dictionaries(
                st.sampled_from(powers),
                st.one_of(st.integers(0, 4).map(float), st.floats(0, 20)),
                min_size=1,
            ),
            max_size=4,
        )
    )
    return durations, gpus, occupied


@settings(max_examples=300, deadline=None)
@given(instance=chunk_instances())
def test_dp_arrange_chunks_matches_explicit_packing(
    instance: tuple[list[Task], int, frozenset[int]],
) -> None:
    durations, gpus, occupied = instance

    def fits(units: tuple[int, ...]) -> bool:
        return place(units, gpus, occupied)

    free = [size for _, size in free_blocks(gpus, occupied)]
    result = dp_arrange_chunks(durations, gpus, free=free)
    check_arrangement(result, durations, brute_force(durations, fits))
    if result is not None:
        offsets = pack_chunks(result.units, gpus, occupied=occupied)
        assert offsets is not None, "the GPU manager can place what the operator chose"


@settings(max_examples=80, deadline=None)
@given(
    durations=st.lists(
        st.dictionaries(st.sampled_from([1, 2, 4]), st.floats(0, 20), min_size=1), max_size=4
    ),
    busy=st.lists(st.frozensets(st.integers(0, 3)), min_size=2, max_size=2),
)
def test_dp_arrange_chunks_over_two_nodes(
    durations: list[Task], busy: list[frozenset[int]]
) -> None:
    def fits(units: tuple[int, ...]) -> bool:
        return place_on_nodes(units, 4, busy)

    free = [size for node in busy for _, size in free_blocks(4, node)]
    result = dp_arrange_chunks(durations, 4, free=free)
    check_arrangement(result, durations, brute_force(durations, fits))


@settings(max_examples=200, deadline=None)
@given(instance=chunk_instances())
def test_idle_node_reduces_to_the_unit_pool(
    instance: tuple[list[Task], int, frozenset[int]],
) -> None:
    durations, gpus, _ = instance
    assert dp_arrange_chunks(durations, gpus) == dp_arrange(durations, gpus)


def test_fragmented_node_is_not_a_unit_pool() -> None:
    # GPUs 0 and 5 busy: six free, yet no aligned chunk of 4 is.
    durations = [{4: 1.0, 2: 3.0}, {2: 2.0}]
    free = [size for _, size in free_blocks(8, {0, 5})]
    assert dp_arrange(durations, 6) == Arrangement(total=3.0, units=(4, 2))
    assert dp_arrange_chunks(durations, 8, free=free) == Arrangement(total=5.0, units=(2, 2))
    assert dp_arrange_chunks([{8: 1.0}], 8, free=free) is None


@pytest.mark.parametrize(
    ("durations", "gpus", "free", "message"),
    [
        ([{3: 1.0}], 8, None, "task 0: unit count must be a power of two"),
        ([{16: 1.0}], 8, None, "more than a node's 8"),
        ([{1: 1.0}], 6, None, "GPUs per node must be a power of two"),
        ([{1: 1.0}], 0, None, "GPUs per node must be a power of two"),
        ([{1: 1.0}], 8, [3], "free block must be a power of two"),
        ([{1: 1.0}], 8, [16], "free block is 16 GPUs"),
        ([{1: -1.0}], 8, None, "finite and >= 0"),
    ],
)
def test_dp_arrange_chunks_rejects_bad_input(
    durations: list[Task], gpus: int, free: list[int] | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        dp_arrange_chunks(durations, gpus, free=free)


# ---------------------------------------------------------------------------------------------
# Free blocks and packing


@settings(max_examples=300, deadline=None)
@given(
    gpus=st.sampled_from([1, 2, 4, 8, 16]),
    data=st.data(),
)
def test_pack_chunks_packs_iff_any_packing_exists(gpus: int, data: st.DataObject) -> None:
    occupied = data.draw(st.frozensets(st.integers(0, gpus - 1)))
    powers = [1 << p for p in range(gpus.bit_length())]
    sizes = data.draw(st.lists(st.sampled_from(powers), max_size=6))
    offsets = pack_chunks(sizes, gpus, occupied=occupied)
    assert (offsets is not None) == place(sorted(sizes, reverse=True), gpus, occupied)
    if offsets is None:
        return
    taken = set(occupied)
    for size, start in zip(sizes, offsets, strict=True):
        assert start % size == 0 and 0 <= start <= gpus - size, "aligned, on the node"
        chunk = set(range(start, start + size))
        assert not chunk & taken, "no overlap with busy GPUs or other chunks"
        taken |= chunk


def test_pack_chunks_places_largest_first_into_the_smallest_block() -> None:
    assert pack_chunks([1, 4, 2, 1], 8) == [6, 0, 4, 7]
    assert pack_chunks([1], 8, occupied={0, 1, 2, 3, 5}) == [4]
    assert pack_chunks([2, 2], 4, occupied={1}) is None
    assert pack_chunks([], 8) == []


@settings(max_examples=200, deadline=None)
@given(gpus=st.sampled_from([1, 2, 4, 8, 16]), data=st.data())
def test_free_blocks_are_the_maximal_aligned_free_blocks(gpus: int, data: st.DataObject) -> None:
    occupied = data.draw(st.frozensets(st.integers(0, gpus - 1)))
    blocks = free_blocks(gpus, occupied)
    covered = [g for start, size in blocks for g in range(start, start + size)]
    assert sorted(covered) == [g for g in range(gpus) if g not in occupied], "exact, disjoint"
    assert blocks == sorted(blocks)
    for start, size in blocks:
        assert start % size == 0 and size & (size - 1) == 0
        if size < gpus:  # maximal: the aligned block twice as large holds a busy GPU
            parent = start - start % (2 * size)
            assert occupied & set(range(parent, parent + 2 * size))


def test_free_blocks_and_pack_chunks_reject_bad_input() -> None:
    with pytest.raises(ConfigError, match="occupied GPU 8"):
        free_blocks(8, {8})
    with pytest.raises(ConfigError, match="chunk 1 must be a power of two"):
        pack_chunks([2, 3], 8)
    with pytest.raises(ConfigError, match="GPUs per node"):
        pack_chunks([1], 12)


# ---------------------------------------------------------------------------------------------
# Operators


def test_operators_dispatch_to_their_dp() -> None:
    durations = [{1: 4.0, 2: 2.5, 4: 1.0}, {1: 3.0, 2: 1.0}]
    pool: DpOperator[int] = UnitPoolOperator()
    chunks: DpOperator[Sequence[int]] = ChunkOperator(gpus=4)
    assert pool.arrange(durations, 5) == dp_arrange(durations, 5)
    assert chunks.arrange(durations, [4]) == dp_arrange_chunks(durations, 4)
    assert chunks.arrange(durations, [2, 1]) == Arrangement(total=5.0, units=(1, 2))
    with pytest.raises(ConfigError, match="power of two"):
        ChunkOperator(gpus=6)


# ---- every eviction prefix at once (the scheduler's view) ----------------------------------


@st.composite
def _range_tasks(draw: st.DrawFn, convex: bool) -> list[Task]:
    """Tasks taking any count in a range; `convex`: savings per extra unit never grow (they may
    turn negative: more units can be slower)."""
    tasks = []
    for _ in range(draw(st.integers(1, 7))):
        low, n = draw(st.integers(1, 4)), draw(st.integers(1, 6))
        if convex:
            gains = sorted(draw(st.lists(st.floats(-5, 20), min_size=n - 1, max_size=n - 1)))
            ds = list(itertools.accumulate(reversed(gains), lambda d, g: d - g, initial=0.0))
            ds = [d - min(ds) for d in ds]
        else:
            ds = draw(st.lists(st.floats(0, 100), min_size=n, max_size=n))
        tasks.append({low + j: d for j, d in enumerate(ds)})
    return tasks


@settings(max_examples=300, deadline=None)
@given(st.booleans().flatmap(_range_tasks), st.integers(0, 30))
def test_prefix_arrangements_equal_dp_arrange_of_every_prefix(
    durations: list[Task], budget: int
) -> None:
    prefixes = PrefixArrangements(durations, budget)
    for k in range(len(durations) + 1):
        want, got = dp_arrange(durations[:k], budget), prefixes.arrangement(k)
        if want is None:
            assert got is None and prefixes.total(k) is None
            continue
        assert got is not None and prefixes.total(k) == got.total
        assert math.isclose(got.total, want.total, rel_tol=1e-9, abs_tol=1e-9)
        assert sum(got.units) <= budget
        assert all(u in durations[i] for i, u in enumerate(got.units))
        chosen = sum(durations[i][u] for i, u in enumerate(got.units))
        assert math.isclose(chosen, got.total, rel_tol=1e-9, abs_tol=1e-9)


def test_convex_savings_take_the_greedy_path_and_others_the_table() -> None:
    amdahl = [{m: 10.0 * (0.1 + 0.9 / m) for m in range(1, 33)} for _ in range(8)]
    assert PrefixArrangements(amdahl, 64)._savings is not None
    bumpy = [*amdahl, {1: 5.0, 2: 4.9, 3: 1.0}]  # the third unit saves more than the second
    assert PrefixArrangements(bumpy, 64)._savings is None
    gappy = [*amdahl, {1: 5.0, 4: 2.0}]
    assert PrefixArrangements(gappy, 64)._savings is None
    assert PrefixArrangements(bumpy, 64).total(9) == dp_arrange(bumpy, 64).total


# ---- per-task tables checked once (the scheduler's cache) ----------------------------------


def _reference_greedy(durations: list[Task], budget: int, k: int) -> Arrangement | None:
    """The greedy path written out: every positive marginal saving of the first k tasks,
    ranked by size (ties: earlier task, then fewer units), the first `spare` of them taken,
    the chosen durations added in task order."""
    tasks = durations[:k]
    spare = budget - sum(min(t) for t in tasks)
    if spare < 0:
        return None
    ranked = sorted(
        (-(t[u] - t[u + 1]), i, u)
        for i, t in enumerate(tasks)
        for u in sorted(t)[:-1]
        if u + 1 <= budget and t[u] - t[u + 1] > 0
    )
    units = [min(t) for t in tasks]
    for _, i, _ in ranked[:spare]:
        units[i] += 1
    return Arrangement(total=chosen_total(tasks, units), units=tuple(units))


@st.composite
def _amdahl_tasks(draw: st.DrawFn) -> tuple[list[Task], int]:
    """Convex tasks from a seed (random floats, so no two savings tie by accident), many of
    them with long ranges, and a budget from tight to loose: the greedy path's head of ranked
    savings must grow for some prefixes and not for others."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 90))
    tasks = []
    for _ in range(n):
        low, high = rng.randint(1, 3), rng.randint(1, 32)
        t, p, c = rng.lognormvariate(1.0, 1.0), rng.uniform(0.3, 1.0), rng.uniform(0, 0.02)
        tasks.append({m: t * (p / m + 1 - p) + c * t * m for m in range(low, low + high)})
    floor = sum(min(t) for t in tasks)
    return tasks, floor + draw(st.integers(0, 3 * n))


@settings(max_examples=80, deadline=None)
@given(_amdahl_tasks())
def test_greedy_prefixes_match_the_written_out_greedy(case: tuple[list[Task], int]) -> None:
    durations, budget = case
    tables = [UnitDurations(t) for t in durations]
    cached, plain = PrefixArrangements(tables, budget), PrefixArrangements(durations, budget)
    assert cached._savings is not None and plain._savings is not None
    for k in range(len(durations), -1, -1):  # the scheduler's order: evict from the back
        want = _reference_greedy(durations, budget, k) if k else Arrangement(total=0.0, units=())
        assert cached.arrangement(k) == plain.arrangement(k) == want


@settings(max_examples=200, deadline=None)
@given(st.booleans().flatmap(_range_tasks), st.integers(0, 30))
def test_unit_durations_arrange_as_plain_mappings(durations: list[Task], budget: int) -> None:
    tables = [UnitDurations(t) for t in durations]
    assert [dict(t) for t in tables] == [dict(sorted(t.items())) for t in durations]
    cached, plain = PrefixArrangements(tables, budget), PrefixArrangements(durations, budget)
    assert (cached._savings is None) == (plain._savings is None)
    for k in range(len(durations) + 1):
        assert cached.arrangement(k) == plain.arrangement(k)
        assert cached.total(k) == plain.total(k)
    assert dp_arrange(tables, budget) == dp_arrange(durations, budget)


def test_unit_durations_cut_and_check_like_the_general_path() -> None:
    table = UnitDurations({3: 1.0, 1: 3.0, 2: 2.0})
    assert list(table) == [1, 2, 3] and table[2] == 2.0 and len(table) == 3
    assert (table.low, table.high) == (1, 3)
    assert table.at_most(5) is table and table.at_most(0) is None
    cut = table.at_most(2)
    assert cut is not None and dict(cut) == {1: 3.0, 2: 2.0} and cut._gains is not None
    assert list(cut._gains) == [1.0]
    assert UnitDurations({1: 5.0, 2: 4.9, 3: 1.0})._gains is None  # savings grow: table
    assert UnitDurations({1: 5.0, 4: 2.0})._gains is None  # a gap: table
    assert dict(UnitDurations({np.int64(2): np.float64(1.5)})) == {2: 1.5}  # general path
    for bad, message in [
        ({1: -1.0}, "finite and >= 0"),
        ({1: math.nan}, "finite and >= 0"),
        ({1: math.inf}, "finite and >= 0"),
        ({0: 1.0}, "integers >= 1"),
        ({True: 1.0}, "integers >= 1"),
        ({1.5: 1.0}, "integers >= 1"),
        ({}, "lists no unit counts"),
    ]:
        with pytest.raises(ConfigError, match=message):
            UnitDurations(bad)
