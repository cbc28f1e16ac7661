"""A rollout's decode throughput as its batch drains: every token counted once, the rate never
above the saturated one, more replicas finish sooner but further below saturation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.perf.latency import RooflineLatencyModel
from loom.sim.rollout.tail import decode_curve

LAT = RooflineLatencyModel("h100", "qwen2.5-7b", tp=2)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 5_000), min_size=1, max_size=200), st.integers(1, 8), st.integers(1, 64)
)
def test_every_token_is_counted_once(lengths, replicas, cap) -> None:
    c = decode_curve(lengths, replicas=replicas, latency=LAT, max_running=cap)
    made = float(np.sum(c.rate * np.diff(c.times)))
    assert made == pytest.approx(sum(lengths), rel=1e-9)
    assert np.all(c.rate >= 0) and np.all(np.diff(c.times) >= 0)
    assert 0 < c.observed_auc_ratio <= 1 + 1e-9


def test_more_replicas_finish_sooner_and_further_below_saturation() -> None:
    rng = np.random.default_rng(0)
    lengths = np.minimum(32_768, rng.lognormal(np.log(3_000), 1.0, 1024)).astype(int) + 1
    small = decode_curve(list(lengths), replicas=1, latency=LAT)
    large = decode_curve(list(lengths), replicas=8, latency=LAT)
    assert large.makespan_s < small.makespan_s
    assert large.auc_ratio < small.auc_ratio  # Fig. 7c: the oversized DP runs unsaturated
    assert large.per_gpu_tok_s < small.per_gpu_tok_s


def test_bad_input() -> None:
    with pytest.raises(ConfigError):
        decode_curve([], replicas=1, latency=LAT)
    with pytest.raises(ConfigError):
        decode_curve([5, 0], replicas=1, latency=LAT)
    with pytest.raises(ConfigError):
        decode_curve([5], replicas=0, latency=LAT)
