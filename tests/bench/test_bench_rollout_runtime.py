"""`benchmarks/bench_rollout_runtime.py` end to end on a tiny batch over two stand-in engines:
it prints its runs and writes one results document whose records carry every figure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loom.bench.results import read_results

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "benchmarks/bench_rollout_runtime.py"

RUN_FIELDS = {
    "record", "workload", "system", "repeat", "turns", "makespan_s", "wall_s", "tokens",
    "throughput_tok_s", "preemptions", "migrations", "router_cpu_s", "router_cpu_ms_per_turn",
    "router_cpu_share", "engines_cpu_s", "agents_cpu_s", "run_cpu_s", "queue_s_per_turn",
    "first_token_s_per_turn", "decode_s_per_turn",
}  # fmt: skip
SYSTEM_FIELDS = {
    "record", "workload", "system", "runs", "makespan_s", "makespan_runs_s", "spread",
    "throughput_tok_s", "preemptions", "migrations", "router_cpu_ms_per_turn",
    "router_cpu_share", "run_cpu_s", "wall_s", "vs_heddle",
}  # fmt: skip
WORKLOAD_FIELDS = {
    "record", "workload", "trajectories", "turns", "output_tokens", "history_trajectories",
    "engines", "best_baseline_over_heddle", "best_peer_over_heddle",
}  # fmt: skip


def _run(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, SCRIPT, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.slow
def test_standins_end_to_end_with_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = [
        "--standin", "2", "--prompts", "1", "--samples", "2", "--max-turn-tokens", "16",
        "--systems", "heddle,slime", "--repeats", "2", "--history", "0", "--json", str(out),
    ]  # fmt: skip
    done = _run(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "batch: 2 trajectories" in done.stdout
    assert "median makespan / heddle's" in done.stdout
    doc = read_results(out)
    assert doc["benchmark"] == "bench_rollout_runtime"
    assert doc["command"] == f"python {SCRIPT} " + " ".join(args)
    assert doc["seed"] == 1 and doc["host"]["cpus"] >= 1
    by: dict[str, list[dict]] = {}
    for r in doc["records"]:
        by.setdefault(r["record"], []).append(r)
    assert sorted(by) == ["run", "system", "workload"]
    runs = by["run"]
    assert [(r["system"], r["repeat"]) for r in runs] == [
        ("heddle", 0), ("slime", 0), ("heddle", 1), ("slime", 1),
    ]  # fmt: skip
    for r in runs:
        assert set(r) == RUN_FIELDS
        assert r["makespan_s"] > 0 and r["tokens"] > 0 and r["turns"] >= 2
        assert r["router_cpu_s"] > 0  # a router in a process of its own
    systems = {r["system"]: r for r in by["system"]}
    assert sorted(systems) == ["heddle", "slime"]
    for name, r in systems.items():
        assert set(r) == SYSTEM_FIELDS
        spans = [x["makespan_s"] for x in runs if x["system"] == name]
        assert r["makespan_runs_s"] == spans and r["runs"] == 2
        assert min(spans) <= r["makespan_s"] <= max(spans)
        assert r["vs_heddle"] == pytest.approx(r["makespan_s"] / systems["heddle"]["makespan_s"])
    (workload,) = by["workload"]
    assert set(workload) == WORKLOAD_FIELDS
    assert (workload["trajectories"], workload["engines"]) == (2, 2)
    assert workload["turns"] == runs[0]["turns"]
    assert workload["best_baseline_over_heddle"] == pytest.approx(systems["slime"]["vs_heddle"])
    assert workload["best_peer_over_heddle"] is None


def test_a_setting_the_benchmark_sets_itself_is_refused() -> None:
    done = _run("--router-set", "placement=heddle", timeout_s=120)
    assert done.returncode == 2
    assert "'placement=heddle': the benchmark sets placement itself" in done.stderr


def test_an_unknown_system_is_refused_before_anything_starts() -> None:
    done = _run("--systems", "heddle,hedle", timeout_s=120)
    assert done.returncode == 1
    assert "unknown system 'hedle'; one of heddle, verl" in done.stderr


def test_peers_over_stand_ins_are_refused_with_the_reason() -> None:
    done = _run("--standin", "2", "--peers", "sglang:manual", timeout_s=120)
    assert done.returncode == 2
    assert "--peers needs engines with a vocabulary" in done.stderr


@pytest.mark.parametrize("engines", [["--vllm", "2"], ["--engine", "http://127.0.0.1:9"]])
def test_peers_over_engines_with_a_vocabulary_are_taken(engines: list[str]) -> None:
    """Stand-ins are the default only where no engines are named: `--vllm` or `--engine` with
    `--peers` passes the peers' check (and stops at the unknown system, before any engine)."""
    done = _run(*engines, "--peers", "sglang:manual", "--systems", "heddle,hedle", timeout_s=120)
    assert "--peers needs engines" not in done.stderr
    assert done.returncode == 1 and "unknown system 'hedle'" in done.stderr


def test_each_workload_on_each_layout_and_a_comparison_across(tmp_path: Path) -> None:
    """`--layouts`: the workload runs on each fleet in turn (its engines at the layout's
    degrees, registered with them), and a record compares the systems across the fleets."""
    out = tmp_path / "r.json"
    args = [
        "--emulate", "qwen3-8b@h100", "--layouts", "2x1,1x2,planned", "--gpus", "2",
        "--kinds", "coding", "--prompts", "4", "--samples", "3", "--max-turns", "2",
        "--token-scale", "0.02", "--tool-scale", "0.02", "--time-scale", "0.05",
        "--repeats", "1", "--systems", "heddle,slime", "--peers", "", "--json", str(out),
    ]  # fmt: skip
    done = _run(*args, timeout_s=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "planned (" in done.stdout and "coding across fleets" in done.stdout
    records = read_results(out)["records"]
    workloads = {r["fleet"]: r for r in records if r["record"] == "workload"}
    assert workloads["2x1"]["layout"] == [1, 1] and workloads["1x2"]["layout"] == [2]
    assert sum(workloads["planned"]["layout"]) <= 2
    runs = [r for r in records if r["record"] == "run"]
    assert {(r["fleet"], r["system"]) for r in runs} == {
        (f, s) for f in ("2x1", "1x2", "planned") for s in ("heddle", "slime")
    }
    (across,) = [r for r in records if r["record"] == "fleets"]
    heddle = next(r for r in records if r["record"] == "system" and r["fleet"] == "planned")
    assert across["heddle_s"] == heddle["makespan_s"]
    slime = {
        r["fleet"]: r["makespan_s"]
        for r in records
        if r["record"] == "system" and r["system"] == "slime"
    }
    assert across["best_baseline_uniform_s"] == min(slime["2x1"], slime["1x2"])
    assert across["best_baseline_planned_s"] == slime["planned"]
    assert across["best_peer_uniform"] is None  # no peer ran
