"""`loom reproduce plexrl`: Table 2's bubble ratios exact from its phase times, Fig. 7b's
records and summary, the report contract."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from loom.cli import app
from loom.experiments import plexrl as ex
from loom.sim.workloads.plexrl import plexrl_jobs, state_costs


def test_table2_bubble_ratios_are_exact_to_a_hundredth_of_a_point() -> None:
    rows = ex.table2_records()
    assert [r["model"] for r in rows] == ["qwen2.5-7b", "qwen3-30b-a3b", "qwen3-235b-a22b"]
    for r in rows:
        assert abs(r["diff_pp"]) <= 0.01
        assert 0 < r["bubble_ratio"] < 1


def test_table1_layouts_give_the_gpu_counts() -> None:
    counts = {j.key: (j.train_gpus, j.rollout_gpus) for j in plexrl_jobs()}
    assert counts == {"7b": (8, 2), "30b": (64, 8), "235b": (96, 32)}
    sc = state_costs()
    big = next(j for j in plexrl_jobs() if j.key == "235b")
    assert sc.rank_bytes(big)[1] == 0.0  # ZeRO-offload: the optimizer never moves


def test_fig7b_plexrl_saves_gpu_hours_over_split_async() -> None:
    rows = ex.fig7b_records(steps=6)
    for model in {r["model"] for r in rows}:
        mine = {r["policy"]: r for r in rows if r["model"] == model}
        assert set(mine) == {"split_async", "plexrl", "plexrl_fcfs", "colocated"}
        assert mine["plexrl"]["gpu_hours_per_step"] < mine["split_async"]["gpu_hours_per_step"]
        assert 0 < mine["plexrl"]["saving_vs_split_async"] < 0.5
    summary = ex.summary(rows + ex.table2_records() + ex.fig7c_records(seed=1))
    assert {r["of"] for r in summary} == {"table2", "fig7b", "fig7c"}


def test_fig7c_small_dp_runs_closer_to_saturation_than_colocated() -> None:
    rows = ex.fig7c_records(seed=1)
    for model in {r["model"] for r in rows}:
        mine = {r["policy"]: r for r in rows if r["model"] == model}
        assert set(mine) == {"plexrl", "colocated"}
        assert mine["plexrl"]["throughput_auc_ratio"] > mine["colocated"]["throughput_auc_ratio"]
        assert mine["colocated"]["replicas"] > mine["plexrl"]["replicas"]


def test_quick_reproduce_writes_the_contract(tmp_path: Path) -> None:
    out = tmp_path / "plexrl.json"
    result = CliRunner().invoke(
        app,
        [
            "reproduce",
            "plexrl",
            "--quick",
            "--only",
            "table2,fig7b,fig7c,fig8",
            "--out",
            str(tmp_path),
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())["records"]
    t2 = [r for r in records if r["experiment"] == "table2"]
    assert {r["model"] for r in t2} == {"qwen2.5-7b", "qwen3-30b-a3b", "qwen3-235b-a22b"}
    assert all("bubble_ratio" in r for r in t2)
    f7 = [r for r in records if r["experiment"] == "fig7b"]
    assert {"plexrl", "split_async"} <= {r["policy"] for r in f7}
    assert all("gpu_hours_per_step" in r and "model" in r for r in f7)
    f7c = [r for r in records if r["experiment"] == "fig7c"]
    assert {r["policy"] for r in f7c} == {"plexrl", "colocated"}
    assert all("throughput_auc_ratio" in r for r in f7c)
    f8 = [r for r in records if r["experiment"] == "fig8"]
    assert {r["policy"] for r in f8} == {"isolated", "pack", "spread", "spread_backfill"}
    for r in f8:
        assert {"time_to_drain_s", "queue_delay_p50", "queue_delay_p90", "queue_delay_p99"} <= set(
            r
        )
    drain = {r["policy"]: r["time_to_drain_s"] for r in f8}
    assert drain["spread_backfill"] < drain["isolated"]
    assert (tmp_path / "plexrl" / "fig7b.png").stat().st_size > 0
    assert (tmp_path / "plexrl" / "fig8.png").stat().st_size > 0
