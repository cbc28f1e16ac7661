"""`loom run grpo` for a few steps, the way CI can afford: two jobs (a one-turn task and a tool
task) training on one node group of the cluster service, their rollouts through the router
into one vLLM engine they share, tools and rewards in the action server's sandbox. Each step
the engines load the job's new version (the router's version only grows, and every response
names the weights loaded); the engines' logprobs of the samples are the trainer's to fp32
precision; the node group and the engine switch between the jobs; nothing is left running."""

from __future__ import annotations

import os
import subprocess
import sys
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
ROOT = Path(__file__).resolve().parents[2]
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
    assert stats["cluster"]["failed"] == 0, stats["cluster_failures"]
    # what a user reads afterwards
    out = tmp_path / "grpo"
    for name in ("records.jsonl", "summary.json", "reward.png", "phases.png"):
        assert (out / name).stat().st_size > 0
    assert set(result.summary["jobs"]) == {"a", "b"}


def test_the_readme_example_as_printed_on_two_steps(tmp_path: Path) -> None:
    """The README's first example, `loom run grpo examples/grpo.toml`, as a user runs it (the
    console script, its own config file) on a short setting: two steps. What it prints and
    writes has the README's shape, and its figures are in their ranges."""
    import json
    import shutil

    out, doc_path = tmp_path / "grpo", tmp_path / "run.json"
    # the console script of the environment under test, wherever PATH points
    here = Path(sys.executable).with_name("loom")
    loom = str(here) if here.exists() else shutil.which("loom") or "loom"
    cmd = [loom, "run", "grpo", "examples/grpo.toml", "--steps", "2", "--out", str(out)]
    before = {p.pid for p in descendants(os.getpid())}
    proc = subprocess.run(
        [*cmd, "--json", str(doc_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    left = [p for p in descendants(os.getpid()) if p.pid not in before]
    assert not left, f"left running: {[p.command for p in left]}"
    printed = " ".join(proc.stdout.split())
    for column in ("reward: first", "last 5", "rollout", "switch", "run wall"):
        assert column in printed, printed[-2000:]
    for name in ("records.jsonl", "summary.json", "reward.png", "phases.png"):
        assert (out / name).stat().st_size > 0
    doc = json.loads(doc_path.read_text())
    assert doc["command"].startswith("loom run grpo examples/grpo.toml --steps 2")
    steps = [r for r in doc["records"] if r["record"] == "step"]
    jobs = {r["job"]: r for r in doc["records"] if r["record"] == "job"}
    assert sorted((r["job"], r["step"]) for r in steps) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert set(jobs) == {"a", "b"} and all(j["task"] == "lookup" for j in jobs.values())
    for r in steps:
        assert 0.0 <= r["reward_mean"] <= 1.0 and r["samples"] == 160
        assert r["logprob_diff_max"] < 1e-4 and r["stale_responses"] == 0
        assert 0 < r["sync_bytes"] < r["sync_dense_bytes"]  # a sparse delta, not a dense copy
        assert r["rollout_s"] > 0 and all(r[f"{p}_s"] >= 0 for p in ("wait", "train", "sync"))
    # both jobs ran at once on one node group and one engine, switching between them
    assert any(r["load_kind"] == "switch" for r in steps)
    a = [(r["start_s"], r["end_s"]) for r in steps if r["job"] == "a"]
    b = [(r["start_s"], r["end_s"]) for r in steps if r["job"] == "b"]
    assert any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)  # concurrent (the config)
    assert jobs["a"]["wall_s"] >= max(e for _, e in a + b) > 0
