"""ProfiledDegreeCost: Heddle's T and F from measured engine profiles, planned with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loom.core.errors import ConfigError
from loom.perf import ProfiledLatencyModel, RooflineLatencyModel, sample_profile, save_profile
from loom.rollout.heddle.planner import AnnealingPlanner, DegreeCostModel
from loom.rollout.heddle.resource_manager import exhaustive_allocation, homogeneous_allocation
from loom.runtime.rollout.cost import ProfiledDegreeCost

SHAPE = {"context_per_seq": 4000, "max_group": 48}
LENGTHS = [9000.0, 7000.0, 5200.0, 3000.0, *np.linspace(300, 2500, 44).tolist()]


def write_profiles(directory: Path, degrees: tuple[int, ...], kv: int | None = None) -> list[Path]:
    """Small profiles (a fitted grid) of an H100 worker of Qwen3-14B at each degree."""
    paths = []
    for tp in degrees:
        lat = RooflineLatencyModel("h100", "qwen3-14b", tp=tp)
        rows = [r for r in sample_profile(lat) if r.prefill_tokens == 0]  # decode regime
        path = directory / f"tp{tp}.csv"
        capacity = lat.kv_capacity_tokens if kv is None else kv
        save_profile(path, rows, tp=tp, kv_capacity_tokens=capacity, note="test")
        paths.append(path)
    return paths


def test_same_arithmetic_as_the_roofline_cost() -> None:
    """Given the roofline's own latency models as profiles, T and F are the roofline's."""
    profiles = {d: RooflineLatencyModel("h100", "qwen3-14b", tp=d) for d in (1, 2, 4)}
    profiled = ProfiledDegreeCost(profiles=profiles, **SHAPE)
    roofline = DegreeCostModel(gpu="h100", model="qwen3-14b", **SHAPE)  # type: ignore[arg-type]
    for d in (1, 2, 4):
        a, b = profiled(d), roofline(d)
        assert a.token_time == b.token_time
        np.testing.assert_array_equal(np.asarray(a.interference), np.asarray(b.interference))
        assert profiled(d) is a  # cached


def test_loaded_profiles_give_a_plausible_cost(tmp_path: Path) -> None:
    cost = ProfiledDegreeCost.load(write_profiles(tmp_path, (1, 2, 4)), **SHAPE)
    assert cost.degrees == (1, 2, 4)
    roofline = DegreeCostModel(gpu="h100", model="qwen3-14b", **SHAPE)  # type: ignore[arg-type]
    for d in (1, 2, 4):
        c = cost(d)
        assert c.token_time == pytest.approx(roofline(d).token_time, rel=0.15)
        f = np.asarray(c.interference)
        assert f[1] == 1.0 and (np.diff(f) >= 0).all() and f[-1] > 1.0
    assert cost(4).token_time < cost(2).token_time < cost(1).token_time


def test_only_profiled_degrees_that_hold_a_trajectory_are_feasible(tmp_path: Path) -> None:
    cost = ProfiledDegreeCost.load(write_profiles(tmp_path, (1, 4)), **SHAPE)
    assert [d for d in (1, 2, 4, 8) if cost.feasible(d)] == [1, 4]
    with pytest.raises(ConfigError, match=r"no engine profile for tp=2; profiled: \(1, 4\)"):
        cost(2)
    small = ProfiledDegreeCost.load(write_profiles(tmp_path, (1,), kv=1000), **SHAPE)
    assert not small.feasible(1)


def test_planner_with_profiled_cost(tmp_path: Path) -> None:
    cost = ProfiledDegreeCost.load(write_profiles(tmp_path, (1, 2, 4)), **SHAPE)
    planner = AnnealingPlanner(cost=cost, degrees=(1, 2, 4, 8), seed=3)
    alloc = planner.allocate(LENGTHS, 8)
    assert sum(alloc.degrees) == 8 and set(alloc.degrees) <= {1, 2, 4}
    assert list(alloc.degrees) == sorted(alloc.degrees, reverse=True)
    assert alloc.placement.num_items == len(LENGTHS)
    assert planner.plan(LENGTHS, 8).degrees == alloc.degrees  # deterministic under a seed
    best = exhaustive_allocation(LENGTHS, 8, cost, degrees=(1, 2, 4))
    assert alloc.makespan == pytest.approx(best.makespan)
    for d in (1, 2, 4):
        assert alloc.makespan <= homogeneous_allocation(LENGTHS, 8, cost, d).makespan + 1e-9
    with pytest.raises(ConfigError, match="can hold"):
        AnnealingPlanner(cost=cost, degrees=(8,)).plan(LENGTHS, 8)


def test_bad_profiles_are_refused(tmp_path: Path) -> None:
    (one,) = write_profiles(tmp_path, (1,))
    copy = tmp_path / "again.csv"
    copy.write_text(one.read_text())
    with pytest.raises(ConfigError, match="two profiles for tp=1"):
        ProfiledDegreeCost.load([one, copy], **SHAPE)
    with pytest.raises(ConfigError, match="at least one"):
        ProfiledDegreeCost.load([], **SHAPE)
    lat = ProfiledLatencyModel.load(one)
    with pytest.raises(ConfigError, match="given for tp=2 was measured at tp=1"):
        ProfiledDegreeCost(profiles={2: lat}, **SHAPE)
    with pytest.raises(ConfigError, match=">= 1"):
        ProfiledDegreeCost(profiles={1: lat}, context_per_seq=0, max_group=4)
