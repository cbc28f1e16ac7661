"""The GPU-hour meter the cluster simulators share: a step function of provisioned GPUs
integrates to the brute-force sum over unit time slices; holds add; time never goes back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom.sim.metrics import GpuMeter


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 64)), min_size=1, max_size=12))
def test_a_step_function_integrates_to_its_unit_slices(changes: list[tuple[int, int]]) -> None:
    changes = sorted(changes)
    meter = GpuMeter()
    for t, gpus in changes:
        meter.set("p", gpus, float(t))
    end = changes[-1][0] + 5
    meter.advance("p", float(end))
    level, brute = 0, 0
    by_t = {}
    for t, gpus in changes:
        by_t[t] = gpus  # the last change at a time wins
    for t in range(changes[0][0], end):
        level = by_t.get(t, level)
        brute += level
    assert meter.provisioned["p"] == pytest.approx(brute)
    meter.hold("p", 3, 1.0, 2.5)
    assert meter.gpu_hours() == pytest.approx((brute + 4.5) / 3600)


def test_bad_input_is_refused() -> None:
    meter = GpuMeter()
    meter.set("p", 1, 5.0)
    with pytest.raises(ValueError, match="back"):
        meter.advance("p", 4.0)
    with pytest.raises(ValueError, match="-1"):
        meter.set("p", -1, 6.0)
    with pytest.raises(ValueError):
        meter.hold("p", 1, 2.0, 1.0)
