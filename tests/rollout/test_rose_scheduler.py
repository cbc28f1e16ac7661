"""ROSE's elastic rollout scheduler: the order of §4.3 (affinity, dedicated under its cap, an
eligible lent worker, the central queue), Table 3's variants, and never a turn on an
ineligible or stale worker."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom.core.errors import ConfigError, UnknownPolicyError
from loom.rollout.rose import ROSE_ROUTERS, ElasticRouter, RoutingKind, WorkerKind


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
