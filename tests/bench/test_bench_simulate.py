"""The benchmark's batch in the simulator, on a measured profile and on an emulated GPU:
deterministic, and what the served router adds makes it slower."""

from __future__ import annotations

from pathlib import Path

from bench_rig import tiny_batch

from loom.bench.settings import RouterSetup
from loom.bench.simulate import simulate, simulate_emulated
from loom.runtime.rollout.standin import write_standin_profile


def test_simulate_on_a_profile(tmp_path: Path) -> None:
    profile = tmp_path / "standin.csv"
    write_standin_profile(profile, 0.01)
    config, batch = tiny_batch()
    setup = RouterSetup(max_running=4)
    span = simulate(config, setup, ("least_load", "rr"), batch, 2, profile)
    assert span > 0
    assert span == simulate(config, setup, ("least_load", "rr"), batch, 2, profile)
    # the longest trajectory's decode steps at least (one token a step of 10 ms)
    longest = max(sum(t.output_tokens for t in turns) for _, turns in batch)
    assert span >= longest * 0.01


def test_simulate_emulated_with_and_without_the_router() -> None:
    config, batch = tiny_batch(history=1)
    setup = RouterSetup(max_running=1024, tp=2, priority=True, model="qwen3-14b", gpu="h100")
    bare = simulate_emulated(config, setup, ("heddle", "pps"), batch, 2, engine_max_running=64)
    again = simulate_emulated(config, setup, ("heddle", "pps"), batch, 2, engine_max_running=64)
    assert bare.makespan_s == again.makespan_s > 0
    routed = simulate_emulated(
        config, setup, ("heddle", "pps"), batch, 2,
        engine_max_running=64, dispatch_s=0.5, decision_s=0.1,
    )  # fmt: skip
    turns = max(len(t) for _, t in batch)  # each waits its dispatch, one after the other
    assert routed.makespan_s > bare.makespan_s
    assert routed.makespan_s >= turns * 0.5
