"""Trajectories under continuous load through Loom's router: every turn answered, every figure
reported flat."""

from __future__ import annotations

import asyncio

import pytest

from loom.bench.continuous import run_trajectories, trajectories
from loom.bench.routers import ThreadRouter


def test_continuous_trajectories_run_to_the_end(router: ThreadRouter) -> None:
    trajs = trajectories(4, 0.2, seed=3)
    assert trajs == trajectories(4, 0.2, seed=3)
    for t in trajs:
        assert 3 <= len(t["outputs"]) <= 6 and len(t["tools"]) == len(t["outputs"]) - 1
        assert all(0.5 <= s <= 3.0 for s in t["tool_s"]) and 0 <= t["arrival_s"] <= 0.2
        t["tool_s"] = [0.01] * len(t["tool_s"])  # a short run
        t["outputs"] = [min(n, 8) for n in t["outputs"]]
    got = asyncio.run(run_trajectories(router.url, trajs))
    assert got["failed"] == 0
    assert got["turns"] == sum(len(t["outputs"]) for t in trajs)
    assert got["tokens_per_s"] * got["makespan_s"] == pytest.approx(
        sum(sum(t["outputs"]) for t in trajs)
    )
    assert "reprefill_placement_tokens" in got  # flat, one field per why
    assert not any(isinstance(v, dict) for v in got.values())
