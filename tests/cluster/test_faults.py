"""The cluster service's fault decisions as plain values: an operation's deadline from its
expected duration, a floor and the caller's override; a torn-down group restarted only from
state its node holds whole, and not forever."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom.cluster.faults import DeadlinePolicy, RecoveryAction, RecoveryPolicy
from loom.core.errors import ConfigError


def test_a_deadline_is_a_multiple_of_the_expected_duration_above_a_floor() -> None:
    p = DeadlinePolicy(factor=10, floor_s=120)
    assert p.deadline_s(30.0) == 300.0
    assert p.deadline_s(0.5) == 120.0
    assert p.deadline_s(None) == 120.0
    assert p.deadline_s(30.0, override_s=4.0) == 4.0  # the caller's own, even below the floor


@given(
    factor=st.floats(1, 100),
    floor=st.floats(0.1, 1000),
    expected=st.floats(0, 1e5),
)
def test_a_deadline_never_falls_below_the_floor_or_the_scaled_duration(
    factor: float, floor: float, expected: float
) -> None:
    d = DeadlinePolicy(factor=factor, floor_s=floor).deadline_s(expected)
    assert d >= floor and d >= factor * expected


def test_bad_deadline_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="factor"):
        DeadlinePolicy(factor=0.5)
    with pytest.raises(ConfigError, match="floor"):
        DeadlinePolicy(floor_s=0)
    with pytest.raises(ConfigError, match="max_restarts"):
        RecoveryPolicy(max_restarts=-1)


def test_only_state_held_whole_is_restarted_and_not_forever() -> None:
    p = RecoveryPolicy(max_restarts=2)
    lost = p.decide(reason="rank 1 died", state_intact=False, restarts=0)
    assert lost.action is RecoveryAction.FAIL and lost.reason.startswith("rank 1 died")
    assert "not restarted" in lost.reason
    assert p.decide(reason="x", state_intact=True, restarts=1).action is RecoveryAction.RESTART
    spent = p.decide(reason="x", state_intact=True, restarts=2)
    assert spent.action is RecoveryAction.FAIL and "2 times" in spent.reason
