"""Interference curve: starts at 1, never decreases, and reflects batching and KV capacity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom.core.errors import ConfigError
from loom.perf import RooflineLatencyModel, interference_curve, token_time

H100_14B = RooflineLatencyModel("h100", "qwen3-14b")


def test_token_time_is_a_batch_one_decode_step() -> None:
    assert token_time(H100_14B, 4096) == H100_14B.decode_step_time(1, 4096)


@given(
    st.sampled_from([("h100", "qwen3-14b", 1), ("h20", "qwen3-32b", 2), ("a100", "qwen3-8b", 1)]),
    st.integers(0, 300),
    st.integers(0, 64_000),
    st.none() | st.integers(1, 512),
    st.floats(0.01, 1.0),
)
def test_curve_starts_at_one_and_never_decreases(setup, size, ctx, max_batch, frac) -> None:
    curve = interference_curve(RooflineLatencyModel(*setup), size, ctx, max_batch, frac)
    assert curve.shape == (size + 1,)
    assert curve[: min(2, size + 1)].tolist() == [1.0] * min(2, size + 1)
    assert (np.diff(curve) >= 0).all()
    assert (curve >= 1.0).all()


def test_batching_is_sublinear_below_capacity() -> None:
    curve = interference_curve(H100_14B, 64, 2048)
    assert 1.0 < curve[64] < 2.0  # 64 memory-bound decodes share one weight read


def test_queueing_beyond_max_batch_multiplies_the_slowdown() -> None:
    curve = interference_curve(H100_14B, 40, 2048, max_batch=10)
    step = H100_14B.decode_step_time(10, 10 * 2048) / H100_14B.decode_step_time(1, 2048)
    assert curve[10] == pytest.approx(step)
    assert curve[40] == pytest.approx(4 * step)


def test_default_cap_comes_from_kv_capacity() -> None:
    ctx = 32_768
    cap = H100_14B.kv_capacity_tokens // ctx
    curve = interference_curve(H100_14B, 3 * cap, ctx)
    assert curve[3 * cap] == pytest.approx(3 * curve[cap])


def test_tool_time_away_lowers_the_curve() -> None:
    busy = interference_curve(H100_14B, 100, 4096)
    away = interference_curve(H100_14B, 100, 4096, active_fraction=0.25)
    assert (away <= busy).all()
    assert away[100] == pytest.approx(busy[25])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_size": -1}, "max_size"),
        ({"context_per_seq": -1}, "context_per_seq"),
        ({"active_fraction": 0.0}, "active_fraction"),
        ({"max_batch": 0}, "max_batch"),
    ],
)
def test_invalid_arguments_raise(kwargs: dict[str, float], match: str) -> None:
    args = {"max_size": 8, "context_per_seq": 1024} | kwargs
    with pytest.raises(ConfigError, match=match):
        interference_curve(H100_14B, **args)  # type: ignore[arg-type]
