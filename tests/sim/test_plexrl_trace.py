"""Fig. 8's fixed-capacity trace simulation: every job admitted once and finished, no node
group holding two jobs in one slot, first come first served where no backfilling is allowed,
backfilling never pushing the queue's head back, and the same trace giving the same run."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.sim.cluster.plexrl_trace import Sharing, TraceSimulator
from loom.sim.workloads.plexrl import job_trace


def _run(policy: Sharing, seed: int, jobs: int = 24, groups: int = 3, load: float = 2.0):  # type: ignore[no-untyped-def]
    trace = job_trace(seed, jobs=jobs, groups=groups, load=load, steps=(5, 20))
    horizon = max(j.duration_s + j.footprint.period for j in trace) + 1
    sim = TraceSimulator(trace, groups=groups, nodes_per_group=1, policy=policy, horizon=horizon)
    return trace, sim, sim.run()


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 1000), st.sampled_from(list(Sharing)))
def test_every_job_runs_once_and_nothing_is_double_booked(seed, policy) -> None:
    trace, sim, res = _run(policy, seed)
    assert sorted(r.job_id for r in res.records) == sorted(j.job_id for j in trace)
    by_id = {j.job_id: j for j in trace}
    for r in res.records:
        assert r.start_s >= r.arrival_s and r.end_s - r.start_s == by_id[r.job_id].duration_s
    if policy == Sharing.ISOLATED:  # a group each: never more jobs at once than groups
        events = sorted(
            [(r.start_s, 1) for r in res.records] + [(r.end_s, -1) for r in res.records]
        )
        running = 0
        for _, step in events:
            running += step
            assert running <= 3
    if policy != Sharing.SPREAD_BACKFILL:  # FCFS: admitted in the order they arrived
        order = sorted(res.records, key=lambda r: (r.arrival_s, r.job_id))
        assert all(a.admitted_s <= b.admitted_s for a, b in itertools.pairwise(order))
        assert not any(r.backfilled for r in res.records)
    assert sim.placement.timeline.bookings == {}  # everyone left


def test_backfilling_fills_holes_without_delaying_the_head() -> None:
    _, _, plain = _run(Sharing.SPREAD, seed=3, jobs=40)
    _, _, filled = _run(Sharing.SPREAD_BACKFILL, seed=3, jobs=40)
    assert any(r.backfilled for r in filled.records)
    mean = lambda res: sum(r.wait_s for r in res.records) / len(res.records)  # noqa: E731
    assert mean(filled) <= mean(plain)


def test_sharing_drains_sooner_than_isolation() -> None:
    _, _, iso = _run(Sharing.ISOLATED, seed=5, jobs=40)
    for policy in (Sharing.PACK, Sharing.SPREAD, Sharing.SPREAD_BACKFILL):
        _, _, shared = _run(policy, seed=5, jobs=40)
        assert shared.drain_s < iso.drain_s


def test_same_trace_same_run_and_bad_input() -> None:
    _, _, a = _run(Sharing.SPREAD_BACKFILL, seed=9)
    _, _, b = _run(Sharing.SPREAD_BACKFILL, seed=9)
    assert a.records == b.records
    trace = job_trace(1, jobs=3, groups=1, load=1.0)
    with pytest.raises(ConfigError, match="horizon"):
        TraceSimulator(trace, groups=1, nodes_per_group=1, policy=Sharing.PACK, horizon=100)
    with pytest.raises(ConfigError, match="nodes"):
        TraceSimulator(trace, groups=1, nodes_per_group=2, policy=Sharing.PACK, horizon=10**6)
