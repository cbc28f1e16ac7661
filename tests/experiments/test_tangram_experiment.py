"""ARL-Tangram's reproduction: every case runs, records follow the contract, the summary
computes the paper's headline ratios, and `loom reproduce tangram --quick` end to end."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from typer.testing import CliRunner

from loom.actions.policy import ActionPolicyKind as P
from loom.cli import app
from loom.experiments import tangram
from loom.experiments.tangram import TangramScale
from loom.experiments.tangram_cases import REWARD_TRACE, Case, run_case
from loom.sim.workloads.actions import CodingParams

TINY = TangramScale(
    cpu_nodes=1,
    gpu_batch=16,
    gpu_batches=(16,),
    cpu_node_sweep=(1,),
    gpu_sweep=(8,),
    fig9_batches=(8,),
    fig9_nodes=(1,),
    rl_steps=1,
    cost_batch=16,
)


@pytest.mark.parametrize(
    ("workload", "policy"),
    [
        ("coding", P.TANGRAM),
        ("coding", P.K8S),
        (REWARD_TRACE, P.DOP16),
        ("deepsearch", P.TANGRAM),
        ("deepsearch", P.INDEPENDENT_API),
        ("mopd", P.SGLANG_STATIC),
        ("mopd_search", P.SGLANG_STATIC),
        ("mopd_search", P.SERVERLESSLLM),
    ],
)
def test_every_case_runs(workload: str, policy: P) -> None:
    case = Case(workload=workload, policy=policy, batch_size=8, seed=1, cpu_nodes=1)
    res = run_case(case)
    assert res.actions and all(a.status.terminal for a in res.actions)
    assert case.components()


def test_a_case_runs_the_coding_parameters_it_names() -> None:
    """The calibration (benchmarks/calibrate_tangram_coding.py) varies `Case.coding`: the
    batch, the reward trace and the k8s pods must all follow it."""
    slow_llm = CodingParams(llm_median_s=40.0, env_actions_median=2.0)
    fast_llm = dataclasses.replace(slow_llm, llm_median_s=1.0)

    def llm_s(params: CodingParams, workload: str = "coding", policy: P = P.TANGRAM) -> float:
        case = Case(
            workload=workload, policy=policy, batch_size=6, seed=3, cpu_nodes=1, coding=params
        )
        res = run_case(case)
        return sum(t.llm_s for t in res.trajectories)

    assert llm_s(slow_llm) > 10 * llm_s(fast_llm)
    assert llm_s(slow_llm, policy=P.K8S) > 10 * llm_s(fast_llm, policy=P.K8S)
    assert llm_s(slow_llm, REWARD_TRACE, P.DOP4) > 10 * llm_s(fast_llm, REWARD_TRACE, P.DOP4)


def test_records_follow_the_contract() -> None:
    runs = tangram.Runs(seed=2)
    recs = [r for _, run in tangram.fig6_fig7_tasks(runs, TINY) for r in run()]
    assert {r["experiment"] for r in recs} == {"fig6", "fig7"}
    f7 = [r for r in recs if r["experiment"] == "fig7"]
    assert {(r["workload"], r["policy"]) for r in f7} == {
        ("coding", "tangram"),
        ("coding", "k8s"),
        ("deepsearch", "tangram"),
        ("deepsearch", "independent_api"),
        ("mopd", "tangram"),
        ("mopd", "sglang_static"),
        ("mopd_search", "tangram"),
        ("mopd_search", "sglang_static"),
    }
    for r in f7:
        assert r["avg_act_s"] > 0 and r["step_s"] > 0 and r["llm_s"] > 0
        assert {"tool_s", "reward_s", "traj_act_s", "batch_size", "components"} <= set(r)
    for r in recs:
        if r["experiment"] == "fig6":
            assert r["window_start_s"] >= 0 and r["avg_act_s"] > 0 and r["actions"] >= 1
    again = [r for _, run in tangram.fig6_fig7_tasks(tangram.Runs(seed=2), TINY) for r in run()]
    assert again == recs


def test_summary_ratios_and_gpu_cost_point() -> None:
    def fig8(policy: str, gpus: int, act: float, sweep: str = "cost") -> dict:
        return {
            "experiment": "fig8",
            "resource": "gpu",
            "sweep": sweep,
            "policy": policy,
            "gpus": gpus,
            "batch_size": 1024,
            "avg_act_s": act,
        }

    recs = [
        fig8("sglang_static", 40, 10.0),
        fig8("tangram", 8, 30.0),
        fig8("tangram", 12, 9.0),
        fig8("tangram", 16, 2.0),
        fig8("tangram", 40, 1.0, sweep="batch"),
        fig8("sglang_static", 40, 4.0, sweep="batch"),
        {
            "experiment": "fig9",
            "cpu_cores": 256,
            "batch_size": 256,
            "policy": "tangram",
            "avg_act_s": 10.0,
        },
        {
            "experiment": "fig9",
            "cpu_cores": 256,
            "batch_size": 256,
            "policy": "dop4",
            "avg_act_s": 25.0,
        },
    ]
    rows = {r["metric"]: r for r in tangram.summary(recs)}
    cost = rows["gpu_fraction_at_equal_act"]
    assert cost["gpus"] == 12 and cost["value"] == pytest.approx(0.3)
    assert rows["gpu_act_ratio_vs_sglang_static"]["value"] == pytest.approx(4.0)
    assert rows["fig9_act_ratio_vs_dop4"]["value"] == pytest.approx(2.5)
    assert all(r["experiment"] == "summary" and r["policy"] == "tangram" for r in rows.values())
    assert math.isnan(tangram._ratio(1.0, 0.0))


@pytest.mark.slow
def test_quick_reproduce_writes_every_experiment(tmp_path) -> None:
    out = tmp_path / "t.json"
    result = CliRunner().invoke(
        app,
        [
            "reproduce",
            "tangram",
            "--quick",
            "--seed",
            "1",
            "--out",
            str(tmp_path),
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["system"] == "tangram" and doc["quick"] is True
    recs = doc["records"]
    assert {"fig6", "fig7", "fig8", "fig9", "table1", "summary"} <= {r["experiment"] for r in recs}
    for r in recs:
        assert "policy" in r and "experiment" in r
    f8 = [r for r in recs if r["experiment"] == "fig8"]
    assert {r["policy"] for r in f8} == {"tangram", "k8s", "sglang_static", "serverlessllm"}
    assert {r["sweep"] for r in f8} == {"batch", "capacity", "cost"}
    f9 = [r for r in recs if r["experiment"] == "fig9"]
    assert {r["policy"] for r in f9} == {"tangram", "tangram_lookahead", "dop4", "dop16"}
    t1 = [r for r in recs if r["experiment"] == "table1"]
    assert len(t1) == 4 and all({"exec_s", "queue_s", "overhead_s"} <= set(r) for r in t1)
    metrics = {r["metric"] for r in recs if r["experiment"] == "summary"}
    assert {
        "traj_act_ratio_vs_k8s",
        "gpu_fraction_at_equal_act",
        "fig9_act_ratio_vs_dop4",
        "fig9_act_ratio_vs_dop16",
    } <= metrics
    assert (tmp_path / "tangram" / "fig6.png").exists()
    assert (tmp_path / "tangram" / "fig9.csv").exists()
