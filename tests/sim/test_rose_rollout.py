"""ROSE's rollout driver over dedicated and lent workers (§4.3): nothing is lost when lent
instances cut, stall or fail, a seed gives one result, lent workers wait for the weights, and
bad input is refused."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rose_world import (
    SERVING_LAT,
    SLO,
    WL,
    checked,
    hooks,
    lent_slice,
    make_rollout,
    output_tokens,
    short_day,
    spec,
    specs,
    trace,
)

from loom.core.errors import ConfigError
from loom.core.trajectory import TrajectorySpec, TrajectoryStatus
from loom.experiments import rose_steps as steps
from loom.rollout.rose.admission import AdmissionKind, Role, ServingSlo
from loom.rollout.rose.scheduler import RoutingKind
from loom.sim.rollout.rose import RoseRolloutResult
from loom.sim.rollout.state import TrajState
from loom.sim.workloads.rose import prefill_tokens, train_tokens

RPS = steps.serving_rate(WL, 4)  # the lent slice's serving rate for 4 lent GPUs


def assert_all_finished(res: RoseRolloutResult, trajs: Sequence[TrajectorySpec]) -> None:
    assert res.output_tokens == output_tokens(trajs)
    assert res.kept == res.launched == len(trajs)
    assert res.input_tokens == sum(prefill_tokens(t) for t in trajs)
    assert res.kept_tokens == train_tokens(trajs)
    assert np.all(np.isfinite(res.finish_s)) and np.all(res.finish_s > 0)
    assert res.makespan_s == res.finish_s.max()


# ---- nothing lost ----------------------------------------------------------------------------
@settings(max_examples=10, deadline=None)
@given(
    step=st.integers(0, 5),
    n_groups=st.integers(1, 2),
    n_lent=st.integers(2, 4),
    dedicated=st.integers(1, 2),
    admission=st.sampled_from(list(AdmissionKind)),
    routing=st.sampled_from(list(RoutingKind)),
    seed=st.integers(0, 3),
    failure=st.none() | st.tuples(st.floats(0.0, 150.0), st.integers(0, 3)),
)
def test_every_trajectory_finishes_with_its_output_tokens(
    step: int,
    n_groups: int,
    n_lent: int,
    dedicated: int,
    admission: AdmissionKind,
    routing: RoutingKind,
    seed: int,
    failure: tuple[float, int] | None,
) -> None:
    """Also when one lent instance fails at some point of the run. At least one dedicated
    worker."""
    trajs = specs(n_groups, step)
    r = make_rollout(
        trajs,
        lent=lent_slice(n_lent, admission=admission),
        dedicated=dedicated,
        routing=routing,
        serving=short_day(steps.serving_rate(WL, n_lent), seed=seed),
        cap=8,
    )
    if failure is not None:
        at, victim = failure
        r.eng.schedule(at, r.lent[victim % n_lent].fail)
    res = r.run()
    assert_all_finished(res, trajs)
    assert all(t.status == TrajectoryStatus.FINISHED for t in r.trajs.values())


def test_nothing_is_lost_when_memory_cuts_abort_lent_turns() -> None:
    trajs = specs(2)
    for pool, every, prompt in ((3_000, 5.0, 20_000), (1_500, 0.5, 24_000)):
        res = make_rollout(
            trajs,
            lent=lent_slice(4, pool_pages=pool),
            serving=trace(np.arange(0.0, 300.0, every), prompt, 2_000),
        ).run()
        assert res.cuts > 0 and res.aborts > 0, "the scenario must force memory cuts"
        assert_all_finished(res, trajs)


def test_nothing_is_lost_when_lent_turns_stall() -> None:
    """A TPOT SLO that leaves the decoders no slack: their turns stall and are re-routed."""
    t_dec = SERVING_LAT.decode_step_time(1, 2_000)
    trajs = specs(2)
    res = make_rollout(
        trajs,
        lent=lent_slice(4, slo=ServingSlo(ttft_s=SLO.ttft_s, tpot_s=1.05 * t_dec)),
        serving=trace(np.arange(0.0, 120.0, 0.5), 200, 4_000),
    ).run()
    assert res.stalls > 0
    assert_all_finished(res, trajs)


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_a_failed_lent_worker_gives_its_turns_back_and_gets_no_more(
    monkeypatch: pytest.MonkeyPatch, role: Role
) -> None:
    trajs = specs(2)
    checked(monkeypatch)
    r = make_rollout(trajs, lent=lent_slice(4), serving=short_day(RPS, seed=1))
    dead = next(w for w in r.lent if w.cfg.role == role)
    had: list[int] = []
    enqueued_after: list[int] = []

    def fail() -> None:
        had.append(dead.load)
        dead.fail()

    def record(traj, poke=True, orig=dead.enqueue):  # type: ignore[no-untyped-def]
        if not dead.alive:
            enqueued_after.append(traj.traj_id)
        orig(traj, poke)

    dead.enqueue = record  # type: ignore[method-assign]
    hooks(r).append(lambda: None if dead.alive else _assert_empty(dead))
    r.eng.schedule(20.0, fail)
    res = r.run()
    assert had and had[0] > 0, "the worker must hold turns when it fails"
    assert res.aborts >= had[0]
    assert not enqueued_after, "a dead worker got a turn"
    assert_all_finished(res, trajs)


def _assert_empty(w) -> None:  # type: ignore[no-untyped-def]
    assert not w.running and not w.waiting, f"dead worker {w.idx} holds rollout turns"


# ---- determinism -----------------------------------------------------------------------------
def test_the_same_seed_gives_the_same_result() -> None:
    def once() -> RoseRolloutResult:
        return make_rollout(
            specs(2, step=3),
            lent=lent_slice(4, pool_pages=4_000),
            serving=short_day(2 * RPS, seed=5),
            weights_delay_s=3.0,
        ).run()

    a, b = once(), once()
    assert a.makespan_s == b.makespan_s and a.events == b.events
    for field in ("finish_s", "ttft_s", "tpot_s"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert (a.aborts, a.stalls, a.cuts) == (b.aborts, b.stalls, b.cuts)
    assert len(a.ttft_s) > 0 and a.aborts > 0


def test_the_timeline_counts_every_turn_where_it_is_and_leaves_the_result_alone() -> None:
    trajs = specs(2)  # 32 trajectories, one dedicated worker of 16: the rest queue or go lent
    plain = make_rollout(trajs, lent=lent_slice(4), weights_delay_s=5.0).run()
    r = make_rollout(trajs, lent=lent_slice(4), weights_delay_s=5.0, timeline_s=2.0)
    res = r.run()
    assert res.makespan_s == plain.makespan_s and np.array_equal(res.finish_s, plain.finish_s)
    points = res.timeline
    assert [t for t, *_ in points] == pytest.approx([2.0 * i for i in range(len(points))])
    assert points[-1][0] <= res.makespan_s < points[-1][0] + 2.0  # sampled to the end, no further
    assert points[0][1:] == (32, 16, 16, 0)  # before the weights land: 16 run, 16 wait
    for _, alive, queued, dedicated, lent in points:
        assert queued + dedicated + lent <= alive  # the rest are in their tool calls
        assert dedicated <= 16
    assert any(lent > 0 for *_, lent in points)
    assert plain.timeline == ()
    with pytest.raises(ConfigError, match="timeline_s"):
        make_rollout(trajs, timeline_s=0.0)


# ---- weights ---------------------------------------------------------------------------------
@pytest.mark.parametrize("delay", [0.0, 20.0])
def test_lent_workers_take_no_turn_before_the_weights_land(
    monkeypatch: pytest.MonkeyPatch, delay: float
) -> None:
    trajs = specs(2)  # 32 trajectories, one dedicated worker of 16: half must wait or go lent
    checked(monkeypatch)
    r = make_rollout(trajs, lent=lent_slice(4), weights_delay_s=delay)
    first: dict[str, float] = {}
    for w in r.workers:
        kind = "lent" if w in r.lent else "dedicated"

        def record(traj, poke=True, kind=kind, orig=w.enqueue):  # type: ignore[no-untyped-def]
            first.setdefault(kind, r.eng.now)
            orig(traj, poke)

        w.enqueue = record  # type: ignore[method-assign]

    def running_early() -> None:
        if r.eng.now < delay:
            assert not any(w.running or w.waiting for w in r.lent)

    hooks(r).append(running_early)
    res = r.run()
    assert first["dedicated"] == 0.0
    assert first["lent"] == delay, "lent workers start once the weights land, not later"
    assert_all_finished(res, trajs)


# ---- serving alone and bad input -------------------------------------------------------------
def test_serving_alone_serves_every_arrival_within_the_horizon() -> None:
    arrivals = np.arange(0.0, 100.0, 1.0)
    res = make_rollout(
        (),
        lent=lent_slice(4),
        dedicated=0,
        serving=trace(arrivals, 1_000, 50),
        serving_horizon_s=60.0,
    ).run()
    assert len(res.ttft_s) == len(res.tpot_s) == 61  # arrivals at 0, 1, ..., 60 s
    assert res.ttft_s.min() >= SERVING_LAT.prefill_time(1_000) - 1e-12
    assert (res.makespan_s, res.kept, res.output_tokens, res.lent_busy_s) == (0.0, 0, 0, 0.0)


def test_a_rollout_needs_trajectories_or_serving_and_a_horizon() -> None:
    with pytest.raises(ConfigError, match="at least one trajectory"):
        make_rollout((), lent=lent_slice(4))
    with pytest.raises(ConfigError, match="at least one trajectory"):
        make_rollout((), lent=lent_slice(4), serving=trace([0.0], 10, 10))
    with pytest.raises(ConfigError, match="at least one worker"):
        make_rollout(specs(1), dedicated=0)
    decoders = lent_slice(2, roles=[Role.DECODE, Role.DECODE])
    with pytest.raises(ConfigError, match="prefiller and one decoder"):
        make_rollout(specs(1), lent=decoders, serving=trace([0.0], 10, 10))


def test_a_rollout_runs_once_and_lent_memory_follows_the_steps() -> None:
    lent = lent_slice(2, roles=[Role.PREFILL, Role.DECODE])
    trajs = [spec(0, (100, 20), (30, 10)), spec(1, (50, 5))]
    r = make_rollout(trajs, lent=lent, step=0)
    assert_all_finished(r.run(), trajs)
    with pytest.raises(RuntimeError, match="runs once"):
        r.run()
    assert_all_finished(make_rollout(trajs, lent=lent, step=1).run(), trajs)
    with pytest.raises(ConfigError, match="does not follow"):
        make_rollout(trajs, lent=lent, step=1).run()  # the instances remember step 1


def test_hand_made_trajectories_on_lent_workers_only() -> None:
    trajs = [spec(i, (200 + i, 30), (40, 20 + i), (10, 5)) for i in range(6)]
    res = make_rollout(trajs, lent=lent_slice(2, roles=[Role.PREFILL, Role.DECODE]), dedicated=0)
    out = res.run()
    assert_all_finished(out, trajs)
    assert out.lent_busy_s > 0


# ---- trajectory state ------------------------------------------------------------------------
def test_end_turn_folds_each_turn_into_the_context() -> None:
    t = TrajState(spec(0, (100, 20), (30, 10)), ())
    t.turn_generated = 20
    assert t.full_context() == 120
    assert not t.end_turn(5.0)
    assert (t.context, t.generated, t.turn_generated, t.steps_done) == (120, 20, 0, 1)
    assert t.status == TrajectoryStatus.IN_TOOL and math.isnan(t.finish_s)
    assert t.full_context() == 150
    assert t.end_turn(9.0)
    assert (t.context, t.generated, t.status, t.finish_s) == (
        160,
        30,
        TrajectoryStatus.FINISHED,
        9.0,
    )


# ---- a turn no worker can hold ----------------------------------------------------------------
class _Livelock(Exception):
    """The run went on far past any sensible number of events."""


@pytest.mark.parametrize(("prompt", "output"), [(1_400, 10), (1_000, 1_000)])
def test_a_turn_that_cannot_grow_on_any_worker_ends_the_run(
    monkeypatch: pytest.MonkeyPatch, prompt: int, output: int
) -> None:
    checked(monkeypatch)
    r = make_rollout(
        [spec(0, (prompt, output))],
        lent=lent_slice(2, pool_pages=125, headroom_pages=25, roles=[Role.PREFILL, Role.DECODE]),
        dedicated=0,
    )
    assert r.lent[0].capacity == 0  # set when the step begins: 100 pages of 14 tokens

    def guard() -> None:
        if r.eng.events_run > 5_000:
            raise _Livelock(f"t={r.eng.now:.0f} s, {sum(w.stalls for w in r.lent)} stalls")

    hooks(r).append(guard)
    with pytest.raises((AssertionError, ConfigError)):  # it can never finish: say so and stop
        r.run()
