"""ROSE's scheduler as the rollout router's placement (`--placement rose`): the runtime's
engines read as dedicated and lent workers, the lease on a lent engine's prefix, the central
queue, and callers whose worker views know nothing of lending."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.rollout.policy import ROUTERS, PlacementKind, Router
from loom.rollout.rose import RosePlacement, RoutingKind


@dataclass
class Engine:
    """An engine as the router's driver shows it."""

    idx: int
    tp: int = 1
    node: int = 0
    load: int = 0
    lent: bool = False
    alive: bool = True
    activated: bool = True
    version: int = 0
    free_tokens: int | None = None
    slack_s: float = math.inf

    def cached_tokens(self, traj_id: int) -> int:
        return 0


@dataclass
class Plain:
    """A worker view without ROSE's fields (verl's load balancer)."""

    idx: int
    tp: int = 1
    node: int = 0
    load: int = 0

    def cached_tokens(self, traj_id: int) -> int:
        return 0


@dataclass
class Traj:
    traj_id: int
    context: int = 0
    pending_context: int = 100
    host: int = -1
    last_end_s: float | None = None
    prompt_id: int = 0
    steps_done: int = 0
    generated: int = 0
    first_arrival_s: float = 0.0
    turn_arrival_s: float = 0.0
    predicted_total: float = 1.0


def test_the_placement_is_registered_and_queues() -> None:
    p = ROUTERS.get(PlacementKind.ROSE)(cap_per_gpu=2)
    assert isinstance(p, RosePlacement) and isinstance(p, Router)
    assert type(p).drain is not Router.drain  # it has a central queue of its own
    with pytest.raises(ConfigError, match="lease_s"):
        RosePlacement(lease_s=-1)


def test_dedicated_first_then_lent_with_room_then_the_central_queue() -> None:
    p = RosePlacement(cap_per_gpu=1)
    ded, lent = Engine(0), Engine(3, lent=True, free_tokens=150, slack_s=0.2)
    ws = [ded, lent]
    assert p.route(Traj(1), ws, 0.0) == 0
    ded.load = 1
    assert p.route(Traj(2, pending_context=200), ws, 0.0) is None  # 201 tokens: no room
    assert p.queued == 1
    lent.free_tokens = 201
    assert p.drain(ws, 1.0) == [(2, 3)] and p.queued == 0
    lent.load = 1
    assert p.route(Traj(4), ws, 1.0) is None
    assert p.withdraw(4) and p.queued == 0


def test_a_lent_engine_holds_a_prefix_for_the_lease_only() -> None:
    p = RosePlacement(cap_per_gpu=4, lease_s=10.0)
    ded = Engine(0, load=4)  # full
    a, b = Engine(1, lent=True), Engine(2, lent=True)
    t = Traj(9, pending_context=500)
    assert p.route(t, [ded, a, b], 90.0) == 1  # the least-loaded lent engine (first of a tie)
    t.host, t.context, t.pending_context, t.last_end_s = 1, 600, 620, 100.0
    a.load = 3
    assert p.route(t, [ded, a, b], 109.0) == 1  # within the lease: affinity beats load
    assert p.route(t, [ded, a, b], 111.0) == 2  # past it the prefix is gone: least loaded
    # a dedicated engine keeps a prefix however long the tool call took
    u = Traj(10, pending_context=50)
    ded.load = 0
    assert p.route(u, [ded, Engine(5, load=1)], 0.0) == 0
    u.host, u.context, u.pending_context, u.last_end_s = 0, 60, 80, 1.0
    ded.load = 3
    assert p.route(u, [ded, Engine(5, load=0)], 10_000.0) == 0


def test_a_turn_needs_only_its_new_tokens_where_its_prefix_is() -> None:
    p = RosePlacement(cap_per_gpu=4)
    ded = Engine(0, load=4)
    lent = Engine(1, lent=True, free_tokens=30)
    t = Traj(3, pending_context=20)
    assert p.route(t, [ded, lent], 0.0) == 1  # 21 tokens fit in 30
    t.host, t.context, t.pending_context, t.last_end_s = 1, 20, 45, 5.0
    assert p.route(t, [ded, lent], 6.0) == 1  # 26 new tokens where its prefix is
    assert p.route(Traj(5, pending_context=40), [ded, lent], 6.0) is None  # 41 anywhere


def test_engines_behind_the_weights_or_gone_take_nothing() -> None:
    p = RosePlacement(cap_per_gpu=4)
    e0, e1 = Engine(0), Engine(1, lent=True)
    p.set_version(2)
    e0.version, e1.version = 2, 1
    e0.load = 4
    assert p.route(Traj(1), [e0, e1], 0.0) is None  # e1 is stale
    e1.version = 2
    assert p.drain([e0, e1], 0.0) == [(1, 1)]
    # its engine went away: a re-route avoids it (indices of gone engines stay absent)
    t = Traj(1, host=1, context=10, pending_context=30)
    assert p.route(t, [e0], 1.0) is None
    e0.load = 0
    assert p.drain([e0], 1.0) == [(1, 0)]
    with pytest.raises(ConfigError, match="older"):
        p.set_version(1)


def test_a_caller_without_a_central_queue_may_ask_again() -> None:
    """verl's balancer routes every request and falls back itself: a second route of a
    trajectory whose turn the placement held replaces the held one."""
    p = RosePlacement(cap_per_gpu=1)
    ws = [Plain(0, load=1), Plain(1, load=1)]
    assert p.route(Traj(1), ws, 0.0) is None
    assert p.route(Traj(1), ws, 0.0) is None and p.queued == 1
    ws[1].load = 0
    assert p.route(Traj(1), ws, 0.0) == 1 and p.queued == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5),  # engine
            st.booleans(),  # lent
            st.integers(0, 6),  # load
            st.one_of(st.none(), st.integers(0, 400)),  # free tokens
            st.floats(-1, 1),  # slack
            st.integers(0, 2),  # version
        ),
        min_size=1,
        max_size=6,
        unique_by=lambda x: x[0],
    ),
    st.lists(st.integers(0, 300), min_size=1, max_size=12),
    st.integers(0, 2),
    st.sampled_from(list(RoutingKind)),
)
def test_never_a_turn_on_an_ineligible_engine(engines, contexts, version, kind) -> None:
    p = RosePlacement(kind, cap_per_gpu=3)
    p.set_version(version)
    ws = [
        Engine(i, lent=lent, load=load, free_tokens=free, slack_s=slack, version=v)
        for i, lent, load, free, slack, v in engines
    ]
    by_idx = {w.idx: w for w in ws}
    placed: list[tuple[int, int]] = []
    for tid, ctx in enumerate(contexts):
        target = p.route(Traj(tid, pending_context=ctx), ws, 0.0)
        if target is not None:
            placed.append((tid, target))
            by_idx[target].load += 1
            if by_idx[target].lent and by_idx[target].free_tokens is not None:
                by_idx[target].free_tokens -= ctx + 1
    for w in ws:  # capacity frees everywhere: drain
        w.load = max(0, w.load - 2)
    placed += p.drain(ws, 1.0)
    assert len({t for t, _ in placed}) == len(placed)  # each turn placed once
    assert len(placed) + p.queued == len(contexts)  # nothing lost
    for _, idx in placed:
        w = by_idx[idx]
        assert w.version == version
        if w.lent:
            assert w.slack_s >= 0
