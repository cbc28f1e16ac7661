"""The reproduce pipeline on a tiny scale: record contract, determinism, CLI errors."""

import json

import pytest
from typer.testing import CliRunner

from loom.cli import app
from loom.core.trajectory import WorkloadKind
from loom.experiments import heddle
from loom.experiments.heddle import HEDDLE, HeddleScale, Scenario, baseline_systems


@pytest.fixture(scope="module")
def scenario():
    return Scenario(
        kind=WorkloadKind.SEARCH,
        model="qwen3-8b",
        scale=HeddleScale(gpus=8, per_worker_batch=4, history_epochs=(0, 1)),
        seed=3,
    )


def test_all_systems_finish_the_same_batch(scenario):
    total = sum(t.output_tokens for t in scenario.trajs)
    for spec in [HEDDLE, *baseline_systems("qwen3-8b").values()]:
        res = scenario.simulate(spec)
        assert res.output_tokens == total
        assert res.throughput_tok_s > 0
    assert scenario.heddle_layout().num_gpus == 8


def test_same_seed_same_heddle_result(scenario):
    again = Scenario(kind=scenario.kind, model=scenario.model, scale=scenario.scale, seed=3)
    assert again.heddle_layout() == scenario.heddle_layout()
    assert again.simulate(HEDDLE).makespan_s == scenario.simulate(HEDDLE).makespan_s


def test_fig12_records_follow_the_contract(scenario):
    cells = lambda kind, model: scenario  # noqa: E731
    tasks = list(heddle.fig12_tasks(cells, ("qwen3-8b",)))
    recs = [r for _, run in tasks[:4] for r in run()]
    assert {r["policy"] for r in recs} == {"heddle", "verl", "slime", "verl_star"}
    for r in recs:
        assert r["experiment"] == "fig12" and r["workload"] in {"coding", "search", "math"}
        assert r["model"] == "qwen3-8b" and r["throughput_tok_s"] > 0


def test_fig15_compares_placements_on_one_layout_of_several_workers(scenario):
    cells = lambda kind, model: scenario  # noqa: E731
    recs = [r for _, run in list(heddle.fig15_tasks(cells))[:3] for r in run()]
    assert {r["policy"] for r in recs} == {"heddle", "least_load", "cache_aware"}
    (layout,) = {r["layout"] for r in recs}
    degrees = [int(d) for d in layout.split("x")]
    assert len(degrees) >= 2 and sum(degrees) == scenario.scale.gpus


def test_unknown_system_is_a_clear_error():
    result = CliRunner().invoke(app, ["reproduce", "rollmuxx", "--quick"])
    assert result.exit_code != 0
    assert "Unknown system policy: 'rollmuxx'" in result.output


@pytest.mark.slow
def test_quick_reproduce_writes_every_experiment(tmp_path):
    out = tmp_path / "o.json"
    result = CliRunner().invoke(
        app,
        [
            "reproduce",
            "heddle",
            "--quick",
            "--seed",
            "2",
            "--out",
            str(tmp_path),
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["system"] == "heddle" and doc["seed"] == 2 and doc["quick"] is True
    exps = {r["experiment"] for r in doc["records"]}
    assert {"fig12", "fig13", "fig14", "fig15", "fig16", "table2"} <= exps
    fig14 = [r for r in doc["records"] if r["experiment"] == "fig14"]
    assert {r["policy"] for r in fig14} == {"pps", "fcfs", "rr", "sjf", "pps+repartition"}
    fig15 = {r["policy"] for r in doc["records"] if r["experiment"] == "fig15"}
    assert fig15 == {"heddle", "least_load", "cache_aware", "heddle+repartition"}
    assert all("longest_queue_delay_s" in r for r in fig14)
    assert all(0 < r["mean_active_trajectories"] <= r["trajectories"] for r in fig14)
    assert (tmp_path / "heddle" / "fig12.png").exists()
    assert (tmp_path / "heddle" / "fig12.csv").exists()
