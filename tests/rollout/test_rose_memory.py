"""ROSE's preemptive memory sharing: the budget of each step, the emergency cut, leases, and
the invariants under any sequence of serving bursts, rollout growth and lease expiries."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from loom.core.errors import ConfigError
from loom.rollout.rose import PAGE_BYTES, MemoryConfig, MemorySharing, pages_for


def pool(**kw: object) -> MemorySharing:
    cfg = {"pool_pages": 1000, "headroom_pages": 200, "watermark": 0.5, "lease_s": 10.0}
    cfg.update(kw)
    return MemorySharing(MemoryConfig(**cfg))  # type: ignore[arg-type]


def test_pages_for_rounds_up_to_whole_pages() -> None:
    assert pages_for(0, 1024) == 0
    assert pages_for(1, 1024) == 1
    assert pages_for(PAGE_BYTES // 1024, 1024) == 1
    assert pages_for(PAGE_BYTES // 1024 + 1, 1024) == 2
    with pytest.raises(ConfigError, match="bytes per token"):
        pages_for(10, 0)


def test_the_budget_is_the_pool_less_the_recent_serving_peak_and_the_headroom() -> None:
    m = pool(peak_window_s=60.0)
    m.set_serving(300, now=0.0)
    m.set_serving(100, now=10.0)
    m.begin_step(0, now=20.0)
    assert m.budget == 1000 - 300 - 200  # the peak of the window, not the level now
    # 300 was in force until t=10: at t=69 the window [9, 69] still sees it; at t=71 it does not
    m.begin_step(1, now=69.0)
    assert m.budget == 500
    m.begin_step(2, now=71.0)
    assert m.budget == 1000 - 100 - 200
    m.set_serving(900, now=72.0)
    m.begin_step(3, now=73.0)
    assert m.budget == 0  # never negative


def test_pressure_halves_the_budget_once_dropping_leases_oldest_then_aborting_newest() -> None:
    m = pool()
    m.set_serving(100, now=0.0)
    m.begin_step(0, now=0.0)
    assert m.budget == 700
    assert m.admit(1, 200, traj_id=11) and m.admit(2, 200, traj_id=12)
    m.finish(1, traj_id=11, now=1.0)  # leased until 11
    assert m.admit(3, 100, traj_id=13)
    m.finish(3, traj_id=13, now=2.0)
    assert m.admit(4, 150, traj_id=14) and m.admit(5, 50, traj_id=15)
    assert m.rollout == 700
    # the watermark sits halfway into the headroom: 100 + 100 = 200 serving pages
    assert not m.set_serving(200, now=3.0)
    assert not m.pressure and m.budget == 700
    cut = m.set_serving(201, now=3.5)
    assert m.pressure and m.cuts == 1 and m.budget == 350 == cut.budget_pages
    assert cut.dropped == (11, 13)  # the oldest lease first
    assert cut.aborted == (5,)  # then the newest running requests, until it fits
    assert m.rollout == 350 and set(m.running) == {2, 4}
    # frozen: a second burst in the pressure state does not cut again, and nothing regrows
    m.set_serving(260, now=4.0)
    assert m.cuts == 1 and m.budget == 350
    assert not m.admit(6, 1)
    # leaving pressure does not restore the budget within the step
    m.set_serving(50, now=5.0)
    assert not m.pressure and m.budget == 350
    m.begin_step(1, now=6.0)
    assert m.budget == 1000 - 260 - 200


def test_serving_takes_what_it_needs_even_beyond_the_cut() -> None:
    m = pool(headroom_pages=0, watermark=1.0)
    m.begin_step(0, now=0.0)
    assert m.admit(1, 600) and m.admit(2, 400)
    cut = m.set_serving(700, now=1.0)  # pressure: budget 500, and serving needs 700 of 1000
    assert cut.aborted == (2, 1) and m.rollout == 0 and m.free == 300


def test_a_leased_prefix_is_reused_until_its_lease_ends() -> None:
    m = pool()
    m.begin_step(0, now=0.0)
    assert m.admit(1, 300, traj_id=7)
    m.finish(1, traj_id=7, now=1.0)
    assert m.cached(7) == 300 and m.next_expiry() == 11.0
    assert m.admit(2, 320, traj_id=7)  # the next turn reads the prefix: 20 new pages
    assert m.cached(7) == 0 and m.rollout == 320
    m.finish(2, traj_id=7, now=5.0)
    assert m.expire(14.9) == () and m.expire(15.0) == (7,)
    assert m.rollout == 0


def test_admission_keeps_the_headroom_and_the_budget() -> None:
    m = pool()
    m.set_serving(100, now=0.0)
    m.begin_step(0, now=0.0)
    assert not m.admit(1, 701)
    assert m.admit(1, 700)
    assert not m.grow(1, 1)
    with pytest.raises(ConfigError, match="already running"):
        m.admit(1, 1)
    with pytest.raises(ConfigError, match="not running"):
        m.grow(9, 1)
    with pytest.raises(ConfigError, match="does not follow"):
        m.begin_step(0, now=1.0)
    with pytest.raises(ConfigError, match="pool of 1000"):
        m.set_serving(1001, now=1.0)


@settings(max_examples=60, stateful_step_count=60, deadline=None)
class SharingMachine(RuleBasedStateMachine):
    """Any sequence of steps, serving levels, admissions, growth, finishes and time."""

    def __init__(self) -> None:
        super().__init__()
        self.m = MemorySharing(
            MemoryConfig(pool_pages=512, headroom_pages=96, lease_s=5.0, peak_window_s=30.0)
        )
        self.now = 0.0
        self.step = 0
        self.m.begin_step(0, self.now)
        self.step_budget = self.m.budget
        self.next_request = 0
        self.live: set[int] = set()  # admitted, not finished, released or aborted

    def _cut(self, cut) -> None:  # type: ignore[no-untyped-def]
        assert set(cut.aborted) <= self.live, "aborted a request that was not running"
        self.live -= set(cut.aborted)

    @rule(dt=st.floats(0.0, 8.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.m.expire(self.now)

    @rule(pages=st.integers(0, 512))
    def serving(self, pages: int) -> None:
        self._cut(self.m.set_serving(pages, self.now))

    @rule()
    def new_step(self) -> None:
        self.step += 1
        self._cut(self.m.begin_step(self.step, self.now))
        self.step_budget = self.m.budget

    @rule(pages=st.integers(1, 200), traj=st.integers(0, 6))
    def admit(self, pages: int, traj: int) -> None:
        r = self.next_request
        self.next_request += 1
        if self.m.admit(r, pages, traj_id=traj):
            self.live.add(r)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), pages=st.integers(1, 64))
    def grow(self, data: st.DataObject, pages: int) -> None:
        self.m.grow(data.draw(st.sampled_from(sorted(self.live))), pages)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), traj=st.integers(0, 6), keep=st.booleans())
    def finish(self, data: st.DataObject, traj: int, keep: bool) -> None:
        r = data.draw(st.sampled_from(sorted(self.live)))
        self.m.finish(r, traj, self.now, keep=keep)
        self.live.discard(r)

    @invariant()
    def counters_match_the_holdings(self) -> None:
        held = sum(self.m.running.values()) + sum(p for p, _ in self.m.leased.values())
        assert self.m.rollout == held
        expiries = [until for _, until in self.m.leased.values()]
        assert expiries == sorted(expiries), "leases must expire oldest first"

    @invariant()
    def never_over_the_pool(self) -> None:
        assert self.m.serving + self.m.rollout <= self.m.cfg.pool_pages

    @invariant()
    def rollout_within_its_budget(self) -> None:
        assert self.m.rollout <= self.m.budget

    @invariant()
    def budget_never_rises_within_a_step(self) -> None:
        assert self.m.budget <= self.step_budget
        self.step_budget = self.m.budget

    @invariant()
    def nothing_lost(self) -> None:
        assert set(self.m.running) == self.live


TestSharing = SharingMachine.TestCase
