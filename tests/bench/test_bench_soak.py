"""A router kept busy while its memory is sampled, and how memory grew."""

from __future__ import annotations

import os

import pytest

from loom.bench.routers import ThreadRouter
from loom.bench.soak import growth, soak


def test_soak_samples_memory_while_trajectories_finish(router: ThreadRouter) -> None:
    seen: list[dict] = []
    samples = soak(
        router.url, os.getpid(), trajectories=4, seconds=1.5, every_s=0.5, on_sample=seen.append
    )
    assert samples == seen and len(samples) >= 3
    assert [s["t_s"] for s in samples] == sorted(s["t_s"] for s in samples)
    assert samples[-1]["finished"] > 0 and all(s["rss_mb"] > 0 for s in samples)


def test_growth_over_the_second_half() -> None:
    samples = [
        {"t_s": 0.0, "rss_mb": 100.0, "finished": 0},
        {"t_s": 5.0, "rss_mb": 150.0, "finished": 100},
        {"t_s": 10.0, "rss_mb": 151.0, "finished": 300},
    ]
    assert growth(samples) == {
        "second_half_growth_mb": 1.0,
        "second_half_finished": 200,
        "growth_per_trajectory_kb": pytest.approx(1024 / 200),
        "whole_run_growth_mb": 51.0,
    }
