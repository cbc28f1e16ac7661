"""PlexRL's spatio-temporal view: the segment tree's range min equals brute force after random
updates (wrap-around included), interval sets stay sorted, disjoint and merged, capacity never
goes negative and no node is booked twice in one slot, and the horizon slides."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.cluster.plexrl import Footprint, IntervalSet, MinSegmentTree, Timeline
from loom.core.errors import ConfigError


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 70),
    st.lists(
        st.tuples(st.integers(0, 70), st.integers(0, 70), st.integers(-5, 5), st.booleans()),
        max_size=40,
    ),
)
def test_range_min_equals_brute_force_after_random_updates(size, ops) -> None:
    tree = MinSegmentTree(size, 3)
    brute = [3] * size
    for a, b, v, is_add in ops:
        lo, hi = sorted((a % (size + 1), b % (size + 1)))
        if is_add:
            tree.add(lo, hi, v)
            for i in range(lo, hi):
                brute[i] += v
        else:
            expect = min(brute[lo:hi]) if hi > lo else float("inf")
            assert tree.min(lo, hi) == expect
    assert tree.values() == brute


def test_bad_ranges_are_refused() -> None:
    tree = MinSegmentTree(10)
    with pytest.raises(ConfigError):
        tree.add(3, 11, 1)
    with pytest.raises(ConfigError):
        tree.min(-1, 2)
    with pytest.raises(ConfigError):
        MinSegmentTree(0)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100), st.integers(0, 30), st.booleans()), max_size=40))
def test_interval_sets_stay_sorted_disjoint_and_merged(ops) -> None:
    iv = IntervalSet()
    brute: set[int] = set()
    for s, length, add in ops:
        e = s + length
        if add:
            iv.add(s, e)
            brute |= set(range(s, e))
        elif iv.covers(s, e) and length:
            iv.remove(s, e)
            brute -= set(range(s, e))
    spans = list(iv)
    assert all(s < e for s, e in spans)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))  # merged: gaps
    assert {t for s, e in spans for t in range(s, e)} == brute


def _busy(tl: Timeline) -> dict[int, list[int]]:
    """Per slot of the horizon: how many jobs each node holds there (from the bookings)."""
    count: dict[tuple[int, int], int] = {}
    for booked in tl.bookings.values():
        for n, (s, e) in booked:
            for t in range(s, e):
                count[(n, t)] = count.get((n, t), 0) + 1
    return {
        n: [count.get((n, t), 0) for t in range(tl.now, tl.now + tl.horizon)]
        for n in range(tl.nodes)
    }


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.tuples(st.integers(0, 20), st.integers(1, 10)), min_size=1, max_size=3),
            st.integers(10, 60),  # period
            st.integers(0, 50),  # start
            st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),
        ),
        max_size=8,
    ),
    st.integers(0, 90),
)
def test_commits_never_double_book_and_capacity_never_goes_negative(jobs, advance) -> None:
    tl = Timeline(nodes=4, horizon=97)  # a prime horizon: ranges wrap anywhere
    for k, (segs, period, start, nodes) in enumerate(jobs):
        segs = sorted(segs)
        clean, end = [], 0
        for a, d in segs:
            if a >= end and a + d <= period:
                clean.append((a, d))
                end = a + d
        if not clean:
            continue
        fp = Footprint(tuple(clean), period=period, nodes=len(nodes))
        try:
            tl.commit(f"j{k}", fp, start, nodes)
        except ConfigError:
            continue  # it did not fit: nothing may have changed
        if k % 4 == 3:
            tl.release(f"j{k}")
    tl.advance(advance)
    busy = _busy(tl)
    assert all(c <= 1 for counts in busy.values() for c in counts), "a node held two jobs"
    for t in range(tl.now, tl.now + tl.horizon):
        holding = sum(busy[n][t - tl.now] for n in range(tl.nodes))
        assert tl.min_free(t, t + 1) == tl.nodes - holding >= 0
        for n in range(tl.nodes):
            assert tl.free[n].covers(t, t + 1) == (busy[n][t - tl.now] == 0)


def test_a_commit_is_all_or_nothing_and_release_frees() -> None:
    tl = Timeline(nodes=2, horizon=100)
    tl.commit("a", Footprint(((0, 10),), period=50, nodes=1), 0, [0])
    assert tl.min_free(0, 10) == 1 and tl.min_free(50, 60) == 1 and tl.min_free(10, 50) == 2
    with pytest.raises(ConfigError, match="not free"):
        tl.commit("b", Footprint(((5, 10),), period=100, nodes=2), 0, [0, 1])
    assert tl.min_free(10, 50) == 2 and tl.free[1].covers(0, 100)  # nothing booked for b
    with pytest.raises(ConfigError, match="distinct"):
        tl.commit("c", Footprint(((0, 1),), period=10, nodes=2), 0, [1, 1])
    tl.release("a")
    assert tl.min_free(0, 100) == 2
    with pytest.raises(ConfigError, match="not booked"):
        tl.release("a")


def test_the_horizon_slides_and_the_past_comes_back_free() -> None:
    tl = Timeline(nodes=1, horizon=10)
    tl.commit("a", Footprint(((0, 3),), period=10, nodes=1), 0, [0])
    tl.advance(5)
    assert tl.min_free(5, 15) == 1  # [0, 3) is past; slots 10..14 are new and free
    assert tl.free[0].covers(5, 15)
    with pytest.raises(ConfigError, match="forward"):
        tl.advance(4)
    with pytest.raises(ConfigError, match="past the period"):
        Footprint(((0, 11),), period=10)
    with pytest.raises(ConfigError, match="disjoint"):
        Footprint(((0, 5), (3, 2)), period=10)
