"""`loom run grpo` for a few steps, the way CI can afford: two jobs (a one-turn task and a tool
task) training on one node group of the cluster service, their rollouts through the router
into one vLLM engine they share, tools and rewards in the action server's sandbox. Each step
the engines load the job's new version (the router's version only grows, and every response
names the weights loaded); the engines' logprobs of the samples are the trainer's to fp32
precision; the node group and the engine switch between the jobs; nothing is left running."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from process_tree import descendants

pytest.importorskip("torch")
pytest.importorskip("transformers")

from loom.rl.grpo.config import GRPOConfig
from loom.rl.grpo.run import run_grpo
from loom.runtime.actions.sandbox import bubblewrap_missing
from loom.runtime.engine import INSTALL_HINT, engine_available

pytestmark = [
    pytest.mark.engine,
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.skipif(not engine_available(), reason=f"vLLM is not installed: {INSTALL_HINT}"),
]

STEPS = 2
SANDBOX = "none" if bubblewrap_missing() else "bwrap"  # (the action server's, where it can)


def test_two_jobs_through_the_three_levels(tmp_path: Path) -> None:
    config = GRPOConfig.model_validate(
        {
            "out": tmp_path / "grpo",
            "jobs": [{"name": "a", "task": "lookup", "seed": 1},
                     {"name": "b", "task": "tool", "seed": 2}],
            "grpo": {"steps": STEPS, "samples": 4, "warmup_steps": 30, "warmup_batch": 32,
                     "minibatches": 2},
            "services": {"engines": 1, "sandbox": SANDBOX},
        }
    )  # fmt: skip
    before = {p.pid for p in descendants(os.getpid())}
    stats: dict[str, Any] = {}
    result = run_grpo(config, stats=stats)
    left = [p for p in descendants(os.getpid()) if p.pid not in before]
    assert not left, f"left running: {[p.command for p in left]}"

    records = sorted(result.records, key=lambda r: r.start_s)
    assert sorted((r.job, r.step) for r in records) == [
        (j, s) for j in ("a", "b") for s in range(STEPS)
    ]
    # every step ran on its own version, loaded into the engine for it, and every response
    # came from it
    versions = [r.router_version for r in records]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    for r in records:
        assert r.version == r.step and r.load_kind in ("sync", "switch")
        assert r.stale_responses == 0 and r.samples == 40
        assert r.logprob_diff_max is not None and r.logprob_diff_max < 1e-4, r
        assert r.ratio is not None and r.ratio["min"] > 0  # PPO's ratios were computed
        assert r.sync_bytes > 0 and r.pulled_bytes > 0
        assert set(r.phase_s) >= {"wait", "rollout", "reward", "train", "sync"}
    tool = [r for r in records if r.task == "tool"]
    assert all(r.turns == r.samples + r.tool_calls for r in tool)
    assert sum(r.tool_calls for r in tool) > 0  # the warm-up taught it to call the tool
    # the rewards (one sandboxed run a step) and the tool calls (one a turn that had any) ran
    # in the action server
    runs = stats["sandbox_actions"]
    assert runs.get("succeeded", 0) >= len(records) + sum(1 for r in tool if r.tool_calls)
    assert set(runs) == {"succeeded"} and stats["sandbox"] == SANDBOX
    # the two jobs shared the node group and the engine, switching between them
    assert stats["cluster"]["switches"] > 0 and stats["engine_switches"] > 0
    assert stats["cluster"]["failed"] == 0
    # what a user reads afterwards
    out = tmp_path / "grpo"
    for name in ("records.jsonl", "summary.json", "reward.png", "phases.png"):
        assert (out / name).stat().st_size > 0
    assert set(result.summary["jobs"]) == {"a", "b"}
