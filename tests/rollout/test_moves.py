"""The move rule the served router and its simulation share (`loom.rollout.moves`)."""

from __future__ import annotations

import math

import pytest

from loom.core.topology import GpuType
from loom.perf.latency import RooflineLatencyModel
from loom.rollout.moves import decode_step_s, move_pays, pace_gain_s, prefill_s, slot_wait_s

LAT = RooflineLatencyModel(GpuType.H100, "qwen3-14b", tp=2)


def test_prefill_cost_counts_only_the_tokens_not_cached() -> None:
    assert prefill_s(None, 4096, 0) == 0.0  # no latency model: nothing is known to cost
    assert prefill_s(LAT, 4096, 4096) == prefill_s(LAT, 4096, 10**6) == 0.0
    costs = [prefill_s(LAT, 8192, cached) for cached in (4096, 2048, 0)]
    assert 0 < costs[0] < costs[1] < costs[2]
    # the step's own cost is not counted: it is paid whether the prefill rides along or not
    alone = LAT.iteration_time(1, 0, 8192, 0)
    assert costs[2] == pytest.approx(alone - LAT.iteration_time(1, 0))


@pytest.mark.parametrize(
    ("extra", "here", "there", "pays"),
    [
        (0.0, 0.0, 0.0, True),  # free: where the prefix is cached alike
        (-0.5, 0.0, 3.0, True),  # cheaper there
        (0.5, 0.0, 0.0, False),  # no wait saved
        (0.5, 2.0, 1.6, False),  # saves 0.4 s for 0.5 s of prefill
        (0.5, 2.0, 1.0, True),
        (0.5, math.inf, 0.0, True),  # nothing ends here yet (unmeasured)
    ],
)
def test_a_move_pays_where_the_wait_it_saves_exceeds_its_prefill(extra, here, there, pays):
    assert move_pays(extra, here, there) is pays


def test_slot_wait_scales_with_the_turns_ahead() -> None:
    assert slot_wait_s(4, None) == math.inf
    assert slot_wait_s(0, 2.0) == 2.0  # nothing running: one turn's time, not a division by 0
    assert slot_wait_s(4, 2.0, ahead=7) == pytest.approx(8 * 2.0 / 4)


def test_a_decode_step_grows_with_the_batch_and_its_context() -> None:
    assert decode_step_s(None, 8, 10_000) is None and decode_step_s(LAT, 0, 0) == 0.0
    one = decode_step_s(LAT, 1, 4_000)
    assert 0 < one < decode_step_s(LAT, 64, 64 * 8_000)
    assert decode_step_s(LAT, 8, 8_000) < decode_step_s(LAT, 8, 8 * 8_000)


@pytest.mark.parametrize(
    ("gain", "pays"),
    [(0.6, True), (0.3, False), (-0.1, False)],
)
def test_the_pace_a_move_gains_counts_with_the_wait_it_saves(gain, pays) -> None:
    # 0.5 s of prefill against 0.1 s of wait saved: the pace must make up the rest
    assert move_pays(0.5, 1.1, 1.0, gain) is pays


def test_a_pace_gain_needs_both_steps_and_a_finite_remainder() -> None:
    assert pace_gain_s(1000, 0.03, 0.02) == pytest.approx(10.0)
    assert pace_gain_s(1000, 0.02, 0.03) == pytest.approx(-10.0)  # slower there: a loss
    assert pace_gain_s(1000, None, 0.02) == pace_gain_s(1000, 0.03, None) == 0.0
    for remainder in (0.0, -5.0, math.inf, math.nan):
        assert pace_gain_s(remainder, 0.03, 0.02) == 0.0
