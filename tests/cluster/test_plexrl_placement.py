"""PlexRL's trace-fitting placement (§4.3.2): the exact least shift against the slot-by-slot
scan, commits that never double-book a node, cold start then repacking, the duty-ratio bound,
ranking by interference, the range-min pruning, and the greedy placement against enumeration."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.cluster.plexrl import Footprint, PlacementConfig, PlexPlacement, Timeline, fit, fit_scan
from loom.cluster.plexrl.placement import optimal_assignment
from loom.core.errors import ConfigError


def footprints(max_period: int = 40) -> st.SearchStrategy[Footprint]:
    @st.composite
    def build(draw) -> Footprint:  # type: ignore[no-untyped-def]
        period = draw(st.integers(6, max_period))
        segs, t = [], draw(st.integers(0, 3))
        for _ in range(draw(st.integers(1, 3))):
            d = draw(st.integers(1, 6))
            if t + d > period:
                break
            segs.append((t, d))
            t += d + draw(st.integers(1, 8))
        if not segs:
            segs = [(0, 1)]
        return Footprint(tuple(segs), period=period, nodes=draw(st.integers(1, 2)))

    return build()


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(footprints(), st.integers(0, 30)), max_size=5), footprints(), st.floats(0, 1)
)
def test_the_exact_shift_equals_the_slot_scan(residents, job, alpha) -> None:
    tl = Timeline(nodes=2, horizon=120)
    for k, (fp, start) in enumerate(residents):
        with contextlib.suppress(ConfigError):
            tl.commit(f"r{k}", fp, start, list(range(fp.nodes)))
    max_shift = int(alpha * job.period)
    occ = list(job.occurrences(0, 120))
    free = [tl.free[n] for n in range(job.nodes)]
    assert fit(free, occ, max_shift, end=120) == fit_scan(free, occ, max_shift, end=120)
    inner = [(s, e) for s, e in occ if e + max_shift <= 120]
    assert fit(free, inner, max_shift) == fit_scan(free, inner, max_shift)


def _config(groups=((0,), (1,), (2,)), **kw) -> PlacementConfig:  # type: ignore[no-untyped-def]
    return PlacementConfig(groups=groups, **kw)


@settings(max_examples=40, deadline=None)
@given(st.lists(footprints(), min_size=1, max_size=8), st.sampled_from([0.0, 0.5, 1.0]))
def test_placements_never_double_book_and_report_their_shift(jobs, alpha) -> None:
    tl = Timeline(nodes=4, horizon=200)
    pl = PlexPlacement(tl, _config(groups=((0, 1), (2, 3)), alpha=alpha, duty_bound=1.0))
    for k, fp in enumerate(jobs):
        fp = Footprint(fp.segments, period=fp.period, nodes=2)
        got = pl.place(f"j{k}", fp)
        if got is None:
            continue
        assert 0 <= got.delta <= int(alpha * fp.period)
        assert got.start == tl.now + got.delta and 0.0 <= got.pruned_fraction <= 1.0
        assert got.cost == pytest.approx(2 * got.delta / fp.period)
    slots: dict[tuple[int, int], str] = {}
    for job, booked in tl.bookings.items():
        for n, (s, e) in booked:
            for t in range(s, e):
                assert (n, t) not in slots, f"node {n} holds {slots[(n, t)]} and {job} at {t}"
                slots[(n, t)] = job


def test_a_second_job_takes_the_first_ones_idle_time_with_the_least_shift() -> None:
    tl = Timeline(nodes=1, horizon=600)
    pl = PlexPlacement(tl, _config(groups=((0,),), duty_bound=1.0))
    a = Footprint(((0, 30), (60, 20)), period=100)
    b = Footprint(((0, 25),), period=100)
    first = pl.place("a", a)
    assert first is not None and first.delta == 0
    second = pl.place("b", b)
    assert second is not None and second.delta == 30  # right after a's first segment
    third = pl.place("c", Footprint(((0, 50),), period=100))
    assert third is None  # no 50-s hole within αT = 50 s: it waits


def test_cold_start_dedicates_a_group_then_repacks_from_the_trace() -> None:
    tl = Timeline(nodes=2, horizon=600)
    pl = PlexPlacement(tl, _config(groups=((0,), (1,))))
    cold = pl.cold_start("a", nodes=1)
    assert cold is not None and cold.dedicated and cold.group == 0
    assert pl.place("b", Footprint(((0, 10),), period=100)).group == 1  # type: ignore[union-attr]
    assert pl.cold_start("c", nodes=1) is None  # no empty group left
    warm = pl.repack("a", Footprint(((0, 40),), period=100))
    assert warm is not None and not warm.dedicated
    # a profiled a's cycle: it now shares a group (the least shift wins; a tie goes to slack)
    assert pl.group_of("a") in (0, 1)
    assert tl.min_free(tl.now, tl.now + 600) >= 0


def test_the_duty_ratio_bound_rejects_oversubscription() -> None:
    tl = Timeline(nodes=1, horizon=1000)
    pl = PlexPlacement(tl, _config(groups=((0,),), duty_bound=0.6))
    assert pl.place("a", Footprint(((0, 40),), period=100)) is not None
    assert pl.place("b", Footprint(((0, 30),), period=100)) is None  # 0.7 > 0.6
    assert pl.place("c", Footprint(((0, 20),), period=100)) is not None  # 0.6


def test_interference_prefers_slack_over_a_residents_critical_edge() -> None:
    tl = Timeline(nodes=2, horizon=400)
    pl = PlexPlacement(tl, _config(groups=((0,), (1,)), margin_s=10))
    pl.place_on("tight", Footprint(((5, 60),), period=100), 0)  # leaves [0,5) and [65,100)
    pl.place_on("roomy", Footprint(((50, 10),), period=100), 1)  # leaves [0,50) and [60,100)
    got = pl.place("new", Footprint(((0, 5),), period=100))
    assert got is not None and got.delta == 0 and got.group == 1  # same cost: less interference
    assert got.interference < 1.0


def test_pruning_reports_the_share_the_range_min_removed() -> None:
    tl = Timeline(nodes=2, horizon=600)
    pl = PlexPlacement(tl, _config(groups=((0, 1),), alpha=1.0, duty_bound=1.0))
    pl.place("a", Footprint(((0, 80),), period=100, nodes=2))
    got = pl.place("b", Footprint(((0, 15),), period=100, nodes=2))
    assert got is not None and got.delta == 80
    # only shifts 80..85 keep [δ, δ + 15) off a's [0, 80) and [100, 180): 95 of 101 pruned
    assert got.pruned_fraction == pytest.approx(95 / 101)


@settings(max_examples=15, deadline=None)
@given(st.lists(footprints(max_period=30), min_size=1, max_size=4))
def test_greedy_placement_never_beats_enumeration(jobs) -> None:
    cfg = _config(groups=((0,), (1,)), duty_bound=1.0)
    jobs = [
        (f"j{k}", Footprint(fp.segments, period=fp.period, nodes=1)) for k, fp in enumerate(jobs)
    ]
    best_placed, best_cost, _ = optimal_assignment(2, 120, cfg, jobs)
    pl = PlexPlacement(Timeline(nodes=2, horizon=120), cfg)
    got = [pl.place(job, fp) for job, fp in jobs]
    placed = sum(g is not None for g in got)
    cost = sum(g.cost for g in got if g is not None)
    assert placed <= best_placed
    if placed == best_placed:
        assert best_cost <= cost + 1e-9


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ConfigError, match="share nodes"):
        _config(groups=((0, 1), (1, 2)))
    with pytest.raises(ConfigError, match="non-empty"):
        _config(groups=())
    with pytest.raises(ConfigError, match="not on the timeline"):
        PlexPlacement(Timeline(nodes=2, horizon=10), _config(groups=((5,),)))
    pl = PlexPlacement(Timeline(nodes=1, horizon=50), _config(groups=((0,),)))
    with pytest.raises(ConfigError, match="does not fit the horizon"):
        pl.place("x", Footprint(((0, 10),), period=100))
