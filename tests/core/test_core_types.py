import math

import pytest

from loom.core import (
    ActionKind,
    ActionSpec,
    ActionStatus,
    ConfigError,
    DiscreteSet,
    RangeSet,
    ResourceVector,
    TrajectorySpec,
    TrajectoryStatus,
    TurnSpec,
    WorkloadKind,
    api_quota,
)
from loom.core.errors import UnknownPolicyError
from loom.rollout.policy import SCHEDULERS


def test_resource_vector_arithmetic_and_fit():
    a = ResourceVector(cpu=4, memory_gb=8)
    b = ResourceVector({"cpu": 1, api_quota("search"): 2})
    assert (a + b)["cpu"] == 5 and (a + b)["api:search"] == 2
    assert (a - ResourceVector(cpu=4))["cpu"] == 0
    assert b.fits_in(a + b) and not b.fits_in(a)
    with pytest.raises(ConfigError, match="negative"):
        _ = a - ResourceVector(cpu=5)
    with pytest.raises(ConfigError):
        ResourceVector(cpu=-1)
    with pytest.raises(ConfigError):
        ResourceVector(cpu=math.nan)


def test_feasible_sets():
    assert RangeSet(1, 3).values() == (1, 2, 3)
    assert DiscreteSet((8, 1, 2, 4, 2)).values() == (1, 2, 4, 8)
    with pytest.raises(ConfigError):
        RangeSet(3, 1)


def test_action_duration_uses_elasticity():
    act = ActionSpec(
        action_id="a",
        trajectory_id="t",
        kind=ActionKind.CPU_TOOL,
        demand={"cpu": DiscreteSet((1, 2, 4))},
        t_ori_s=8.0,
        key_resource="cpu",
        elasticity={1: 1.0, 2: 0.9, 4: 0.5},
    )
    assert act.duration_s(1) == 8.0
    assert act.duration_s(4) == pytest.approx(4.0)
    assert ActionStatus.TIMED_OUT.terminal and not ActionStatus.RUNNING.terminal


def test_trajectory_spec_validates_turn_structure():
    turns = (
        TurnSpec(input_tokens=10, output_tokens=5, tool_latency_s=0.1),
        TurnSpec(input_tokens=3, output_tokens=7, tool_latency_s=None),
    )
    t = TrajectorySpec(
        traj_id=0, prompt_id=0, sample_idx=0, workload=WorkloadKind.MATH, turns=turns
    )
    assert t.output_tokens == 12 and t.total_tokens == 25 and t.num_turns == 2
    with pytest.raises(ConfigError, match="last turn"):
        TrajectorySpec(
            traj_id=0, prompt_id=0, sample_idx=0, workload=WorkloadKind.MATH, turns=turns[:1]
        )
    assert TrajectoryStatus.FINISHED > TrajectoryStatus.IN_TOOL


def test_registry_names_unknown_policies():
    with pytest.raises(UnknownPolicyError, match="Unknown turn scheduler policy: 'lifo'"):
        SCHEDULERS.get("lifo")
    assert set(SCHEDULERS.names()) == {"pps", "fcfs", "rr", "sjf"}
