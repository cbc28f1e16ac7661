"""ROSE's elastic rollout scheduler: the order of §4.3 (affinity, dedicated under its cap, an
eligible lent worker, the central queue), Table 3's variants, and never a turn on an
ineligible or stale worker."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.core.errors import ConfigError, UnknownPolicyError
from loom.rollout.rose import ROSE_ROUTERS, ElasticRouter, RoutingKind, WorkerKind
from loom.rollout.rose.scheduler import _Turn


@dataclass
class W:
    idx: int
    kind: WorkerKind = WorkerKind.DEDICATED
    gpus: int = 1
    running: int = 0
    alive: bool = True
    activated: bool = True
    version: int = 0
    free_pages: int = 1000
    slack_s: float = math.inf
    prefixes: set[int] = field(default_factory=set)

    def holds_prefix(self, traj_id: int) -> bool:
        return traj_id in self.prefixes


def lent(idx: int, **kw: object) -> W:
    return W(idx, WorkerKind.LENT, slack_s=kw.pop("slack_s", 0.1), **kw)  # type: ignore[arg-type]


def test_a_turn_goes_to_its_prefix_then_dedicated_then_lent_then_waits() -> None:
    ws = [W(0, running=3), W(1, running=1), lent(2, running=0)]
    r = ElasticRouter(cap_per_gpu=4)
    assert r.submit(7, 10, 100, ws) == 1  # least-loaded dedicated, though a lent one is idle
    ws[1].prefixes.add(7)
    ws[1].running = 3
    assert r.submit(7, 10, 100, ws) == 1  # affinity beats load
    ws[1].running = 4  # at its cap: the least-loaded other dedicated worker
    assert r.submit(7, 10, 100, ws) == 0
    ws[0].running = 4
    assert r.submit(8, 10, 100, ws) == 2  # dedicated full: the lent worker
    ws[2].slack_s = -0.01  # serving has no slack: nothing fits
    assert r.submit(9, 10, 100, ws) is None and r.queued_ids() == [9]
    ws[2].slack_s = 0.0
    assert r.drain(ws) == [(9, 2)] and r.queued == 0


def test_drain_counts_what_it_places_against_the_caps() -> None:
    ws = [W(0, running=2), lent(1, free_pages=150)]
    r = ElasticRouter(cap_per_gpu=3)
    ws[0].running = 3
    ws[1].running = 3
    for t in range(5):
        assert r.submit(t, 0, 100, ws) is None
    ws[0].running = 1  # two slots free on 0; one on the lent worker, pages for one turn
    ws[1].running = 2
    assert r.drain(ws) == [(0, 0), (1, 0), (2, 1)]
    assert r.queued_ids() == [3, 4]


@pytest.mark.parametrize(
    "change",
    [
        {"alive": False},
        {"activated": False},
        {"version": 1},  # behind the current weights (set_version(2) below)
        {"free_pages": 99},
        {"slack_s": -1e-3},
        {"running": 16},
    ],
)
def test_an_ineligible_lent_worker_gets_nothing(change: dict[str, object]) -> None:
    r = ElasticRouter()
    r.set_version(2)
    w = lent(0, version=2, **{k: v for k, v in change.items() if k != "version"})
    if "version" in change:
        w.version = 1  # type: ignore[assignment]
    assert r.submit(1, 10, 100, [w]) is None


def test_turn_wise_ignores_affinity_and_pin_sticks() -> None:
    ws = [W(0, running=2, prefixes={5}), W(1, running=0)]
    tw = ElasticRouter(RoutingKind.TURN_WISE)
    tw._last[5] = 0  # its last turn ran on 0
    assert tw.submit(5, 1, 50, ws) == 1
    pin = ElasticRouter(RoutingKind.PIN, cap_per_gpu=2)
    assert pin.submit(5, 1, 50, ws) == 1
    ws[1].running = 40  # far over its cap: a pinned trajectory still goes there
    assert pin.submit(5, 1, 50, ws) == 1
    ws[1].alive = False  # a dead worker releases it
    ws[0].running = 0
    assert pin.submit(5, 1, 50, ws) == 0 and pin.affine(5) == 0


def test_bad_input_is_refused() -> None:
    r = ElasticRouter()
    ws = [W(0, alive=False)]
    assert r.submit(1, 0, 0, ws) is None
    with pytest.raises(ConfigError, match="already has a turn"):
        r.submit(1, 0, 0, ws)
    with pytest.raises(ConfigError, match="new pages <= context pages"):
        r.submit(2, 5, 1, ws)
    r.set_version(3)
    with pytest.raises(ConfigError, match="older"):
        r.set_version(2)
    with pytest.raises(ConfigError, match="cap_per_gpu"):
        ElasticRouter(cap_per_gpu=0)
    with pytest.raises(UnknownPolicyError, match="pin"):
        ROSE_ROUTERS.get("random")
    assert ROSE_ROUTERS.get("pin")(cap_per_gpu=2).kind == RoutingKind.PIN
    assert r.withdraw(1) and not r.withdraw(1)


worker_states = st.builds(
    lambda i, kind, gpus, running, alive, act, ver, pages, slack, pre: W(
        i, kind, gpus, running, alive, act, ver, pages, slack, pre
    ),
    st.just(0),
    st.sampled_from(list(WorkerKind)),
    st.sampled_from([1, 2, 4]),
    st.integers(0, 80),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2),
    st.integers(0, 300),
    st.floats(-0.5, 0.5),
    st.sets(st.integers(0, 5), max_size=3),
)


@given(
    states=st.lists(worker_states, min_size=1, max_size=8),
    kind=st.sampled_from(list(RoutingKind)),
    turns=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 150)), max_size=12),
    version=st.integers(0, 2),
)
def test_no_turn_is_routed_to_an_ineligible_or_stale_worker(
    states: list[W], kind: RoutingKind, turns: list[tuple[int, int]], version: int
) -> None:
    ws = [W(**{**s.__dict__, "idx": i}) for i, s in enumerate(states)]
    r = ElasticRouter(kind)
    r.set_version(version)
    for traj, extra in turns:
        if traj in r.queued_ids():
            continue
        target = r.submit(traj, extra // 2, extra, ws)
        if target is None:
            continue
        w = ws[target]
        assert w.alive and w.activated and w.version == version, "stale or dead worker"
        if kind == RoutingKind.PIN and r.affine(traj) == target and w.running >= 16 * w.gpus:
            continue  # a pinned trajectory queues on its own worker
        assert w.running < 16 * w.gpus
        if w.kind == WorkerKind.LENT:
            assert w.slack_s >= 0 and w.free_pages >= extra // 2
        w.running += 1


# ---- release and drain's early exits ---------------------------------------------------------
def test_release_drops_the_affinity_and_the_pin() -> None:
    ws = [W(0, running=1, prefixes={5}), W(1, running=0)]
    r = ElasticRouter(cap_per_gpu=4)
    r._last[5] = 0  # its last turn ran on 0, which still holds its prefix
    assert r.submit(5, 1, 50, ws) == 0  # affinity beats load
    r.release(5)
    assert r.affine(5) is None
    assert r.submit(5, 1, 50, ws) == 1  # placed afresh: the least-loaded worker
    pin = ElasticRouter(RoutingKind.PIN, cap_per_gpu=4)
    assert pin.submit(6, 1, 50, ws) == 1 and pin.affine(6) == 1
    ws[0].running = 0
    ws[1].running = 3
    assert pin.submit(6, 1, 50, ws) == 1  # pinned
    pin.release(6)
    assert pin.submit(6, 1, 50, ws) == 0 and pin.affine(6) == 0  # re-pinned where it went
    pin.release(99)  # releasing an unknown trajectory is a no-op
    assert r.queued == pin.queued == 0


def test_release_keeps_a_queued_turn_queued() -> None:
    ws = [W(0, running=2)]
    r = ElasticRouter(cap_per_gpu=2)
    assert r.submit(1, 0, 10, ws) is None
    r.release(1)
    assert r.queued_ids() == [1]
    ws[0].running = 1
    assert r.drain(ws) == [(1, 0)]


def test_a_drain_without_a_free_slot_places_nothing() -> None:
    ws = [W(0, running=2), lent(1, running=2, free_pages=10_000), W(2, running=0, alive=False)]
    r = ElasticRouter(cap_per_gpu=2)
    for t in range(4):
        assert r.submit(t, 0, 10, ws) is None
    assert r.drain(ws) == [] and r.queued_ids() == [0, 1, 2, 3]  # the dead worker is no slot
    ws[1].running = 1
    assert r.drain(ws) == [(0, 1)] and r.queued_ids() == [1, 2, 3]


def test_a_turn_skipped_by_the_page_floor_would_not_fit() -> None:
    """A turn that fits nowhere sets a floor: later turns as big skip the scan (and indeed fit
    nowhere), smaller ones are still placed, and a turn whose prefix holder has room for its
    new pages still goes there."""
    ws = [W(0, running=4), lent(1, running=4, free_pages=100), lent(2, running=4, free_pages=60)]
    ws[2].prefixes.add(3)
    r = ElasticRouter(cap_per_gpu=4)
    r._last[3] = 2
    for t, pages in ((0, 150), (1, 200), (2, 150), (3, 150), (4, 90)):
        assert r.submit(t, 40 if t == 3 else pages, pages, ws) is None  # the fleet is full
    ws[1].running = ws[2].running = 0
    scanned: list[int] = []
    place = r._place

    def spy(turn, workers, taken):  # type: ignore[no-untyped-def]
        scanned.append(turn.traj_id)
        return place(turn, workers, taken)

    r._place = spy  # type: ignore[method-assign]
    assert r.drain(ws) == [(3, 2), (4, 1)]
    assert scanned == [0, 3, 4]  # 1 and 2 skipped by the floor of 150 pages set by 0
    assert r.queued_ids() == [0, 1, 2]
    assert all(place(r._queue[t], ws, {}) is None for t in (1, 2)), "a skipped turn fits"


def _naive_drain(r: ElasticRouter, ws: list[W]) -> list[tuple[int, int]]:
    """Drain without the floor or the early exit: try every queued turn in order."""
    out: list[tuple[int, int]] = []
    taken: dict[int, tuple[int, int]] = {}
    for traj_id, turn in list(r._queue.items()):
        target = r._place(turn, ws, taken)
        if target is None:
            continue
        del r._queue[traj_id]
        out.append((traj_id, target))
        n, p = taken.get(target, (0, 0))
        pages = turn.new_pages if ws[target].holds_prefix(traj_id) else turn.context_pages
        taken[target] = (n + 1, p + pages)
    return out


@settings(max_examples=200, deadline=None)
@given(
    states=st.lists(worker_states, min_size=1, max_size=6),
    kind=st.sampled_from([RoutingKind.ROSE, RoutingKind.TURN_WISE]),
    queue=st.lists(st.tuples(st.integers(0, 150), st.integers(0, 5)), max_size=12),
    version=st.integers(0, 2),
)
def test_drain_places_what_a_naive_drain_places(
    states: list[W], kind: RoutingKind, queue: list[tuple[int, int]], version: int
) -> None:
    ws = [W(**{**s.__dict__, "idx": i}) for i, s in enumerate(states)]
    routers = []
    for _ in range(2):
        r = ElasticRouter(kind)
        r.set_version(version)
        for t, (pages, last) in enumerate(queue):
            r._last[t] = last % len(ws)
            r._queue[t] = _Turn(t, pages // 2, pages)
        routers.append(r)
    fast, naive = routers
    assert fast.drain(ws) == _naive_drain(naive, ws)
    assert fast.queued_ids() == naive.queued_ids()


@pytest.mark.xfail(
    strict=True,
    reason="drain stops when no current worker has a free slot, but under `pin` a turn goes "
    "to its pinned worker whatever its load (as `submit` does): a turn queued while its "
    "pinned worker was behind the weights stays queued once that worker is current again "
    "but at its cap (not reachable from RoseRollout, whose router version is fixed per run)",
)
def test_pin_drain_sends_a_turn_to_its_pinned_worker_once_it_is_current() -> None:
    ws = [W(0, running=0), W(1, running=2)]
    r = ElasticRouter(RoutingKind.PIN, cap_per_gpu=2)
    assert r.submit(5, 1, 10, ws) == 0
    r.set_version(1)
    ws[1].version = 1  # worker 0 falls behind the weights, worker 1 is full
    ws[0].running = 2
    assert r.submit(5, 1, 10, ws) is None and r.affine(5) == 0
    ws[0].version = 1  # worker 0 catches up, still at its cap
    assert r._place(r._queue[5], ws, {}) == 0  # what submit would do
    assert r.drain(ws) == [(5, 0)]
