import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.core.rng import Streams, stream
from loom.sim.engine import Engine


def test_same_time_events_run_by_priority_then_submission_order():
    eng, seen = Engine(), []
    eng.schedule(1.0, seen.append, "late-prio", priority=2)
    eng.schedule(1.0, seen.append, "a", priority=0)
    eng.schedule(1.0, seen.append, "b", priority=0)
    eng.schedule(0.5, seen.append, "first", priority=9)
    eng.schedule(1.0, seen.append, "mid", priority=1)
    eng.run()
    assert seen == ["first", "a", "b", "mid", "late-prio"]


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-2, 2)), min_size=1, max_size=40))
def test_events_come_out_sorted_by_time_priority_seq(items):
    eng, seen = Engine(), []
    for i, (t, p) in enumerate(items):
        eng.schedule(float(t), seen.append, (t, p, i), priority=p)
    eng.run()
    assert seen == sorted(seen)


def test_cancel_drops_event_and_is_idempotent():
    eng, seen = Engine(), []
    ev = eng.schedule(1.0, seen.append, "x")
    eng.schedule(2.0, seen.append, "y")
    eng.cancel(ev)
    eng.cancel(ev)
    assert eng.run() == 1
    assert seen == ["y"]


def test_callbacks_schedule_more_and_time_advances():
    eng, times = Engine(), []

    def tick(n):
        times.append(eng.now)
        if n:
            eng.after(0.5, tick, n - 1)

    eng.schedule(0.0, tick, 3)
    eng.run()
    assert times == [0.0, 0.5, 1.0, 1.5]


def test_run_until_stops_and_advances_clock():
    eng, seen = Engine(), []
    for t in (1.0, 2.0, 3.0):
        eng.schedule(t, seen.append, t)
    eng.run(until=2.0)
    assert seen == [1.0, 2.0] and eng.now == 2.0
    eng.run()
    assert seen == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_delays_are_rejected(bad):
    eng = Engine(start=1.0)
    with pytest.raises(ConfigError):
        eng.after(bad, print)


def test_scheduling_in_the_past_is_rejected():
    eng = Engine(start=5.0)
    with pytest.raises(ConfigError, match="before now"):
        eng.schedule(4.0, print)


def test_streams_depend_only_on_seed_and_name():
    a, b = Streams(7), Streams(7)
    b("other").random()  # creation order must not matter
    assert a("x").random() == b("x").random()
    assert stream(7, "x").random() != stream(8, "x").random()


def test_stop_ends_the_run_after_the_event_in_progress():
    eng, seen = Engine(), []

    def stop_here(x):
        seen.append(x)
        eng.stop()

    eng.schedule(1.0, stop_here, "a")
    eng.schedule(1.0, seen.append, "b")
    eng.schedule(2.0, seen.append, "c")
    assert eng.run() == 1 and seen == ["a"] and eng.now == 1.0
    assert eng.pending == 2  # the rest stays queued
    assert eng.run() == 2 and seen == ["a", "b", "c"]  # a later run goes on
