"""`loom plan rollout`: the annealed layout from a history, as a table and as JSON; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from loom.cli import app
from loom.core.errors import ConfigError
from loom.perf import RooflineLatencyModel, sample_profile, save_profile
from loom.rollout.history import TrajectoryRecord, TurnRecord, read_history, write_history
from loom.runtime.rollout.plan import PlanSettings, plan_rollout, plan_table

runner = CliRunner()


def said(result: Result) -> str:
    """The command's output with rich's panel borders and line wrapping removed."""
    text = result.output.replace("│", " ").replace("╭", " ").replace("╰", " ")
    return " ".join(text.split())


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "history.jsonl"
    args = ["plan", "example-history", str(path), "--workload", "search"]
    result = runner.invoke(app, [*args, "--prompts", "6", "--samples", "8"])
    assert result.exit_code == 0, result.output
    assert "wrote 48 trajectories" in said(result)
    return path


def profiles(directory: Path, degrees: tuple[int, ...], kv: int | None = None) -> list[str]:
    out = []
    for tp in degrees:
        lat = RooflineLatencyModel("h100", "qwen3-14b", tp=tp)
        path = directory / f"tp{tp}.csv"
        capacity = lat.kv_capacity_tokens if kv is None else kv
        save_profile(path, sample_profile(lat), tp=tp, kv_capacity_tokens=capacity)
        out.append(str(path))
    return out


def plan_json(*args: str) -> dict:
    result = runner.invoke(app, ["plan", "rollout", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_table_shows_the_layout_and_the_engines(history: Path) -> None:
    result = runner.invoke(app, ["plan", "rollout", "--gpus", "8", "--history", str(history)])
    assert result.exit_code == 0, result.output
    text = said(result)
    assert "Heddle layout for 8 GPUs" in text
    assert "predicted s ┃ share" in text and "roofline qwen3-14b on h100" in text
    assert "--tensor-parallel-size" in text and "CUDA_VISIBLE_DEVICES=0" in text
    assert '[[engines]] url = "http://127.0.0.1:8001"' in text


def test_json_is_a_consistent_plan(history: Path) -> None:
    plan = plan_json("--gpus", "8", "--history", str(history), "--seed", "2")
    assert sum(plan["degrees"]) == 8
    assert plan["degrees"] == sorted(plan["degrees"], reverse=True)
    workers = plan["workers"]
    assert [w["tp"] for w in workers] == plan["degrees"]
    assert sum(w["trajectories"] for w in workers) == plan["trajectories"] == 48
    assert sorted(g for w in workers for g in w["gpus"]) == list(range(8))
    assert max(w["share"] for w in workers) == pytest.approx(1.0)
    assert max(w["predicted_s"] for w in workers) == pytest.approx(plan["makespan_s"])
    assert plan["engines"] == [{"url": f"http://127.0.0.1:{8001 + i}", "tp": w["tp"]}
                               for i, w in enumerate(workers)]  # fmt: skip
    again = plan_json("--gpus", "8", "--history", str(history), "--seed", "2")
    assert again == plan


def test_profiles_restrict_the_degrees(history: Path, tmp_path: Path) -> None:
    csvs = profiles(tmp_path, (1, 2))
    args = ["--gpus", "6", "--history", str(history), "--gpus-per-node", "4"]
    plan = plan_json(*args, *(x for p in csvs for x in ("--profile", p)))
    assert plan["cost"] == "profiled tp 1, 2"
    assert sum(plan["degrees"]) == 6 and set(plan["degrees"]) <= {1, 2}
    assert {n for w in plan["workers"] for n in w["nodes"]} == {0, 1}
    assert all(e["url"].startswith("http://node") for e in plan["engines"])


def test_plan_rollout_api(history: Path) -> None:
    trajs = read_history(history)
    plan = plan_rollout(trajs, PlanSettings(gpus=4, degrees=(1, 2, 4)))
    assert sum(plan.degrees) == 4
    assert plan.context_per_seq > 0
    with pytest.raises(ConfigError, match="no trajectories"):
        plan_rollout([], PlanSettings(gpus=4))


def test_a_plan_is_for_one_batch_like_the_latest(history: Path) -> None:
    """A history of several epochs plans for a batch the size of one: the groups it places are
    those of the latest `batch` trajectories, not of every epoch at once."""
    trajs = read_history(history)
    n = len(trajs) // 2
    plan = plan_rollout(trajs, PlanSettings(gpus=4, degrees=(1, 2, 4), batch=n))
    assert plan.trajectories == n == sum(w.trajectories for w in plan.workers)
    whole = plan_rollout(trajs, PlanSettings(gpus=4, degrees=(1, 2, 4)))
    assert whole.trajectories == len(trajs)
    assert (
        plan_json("--gpus", "4", "--history", str(history), "--batch", str(n))["trajectories"] == n
    )
    with pytest.raises(ConfigError, match="batch must be >= 1"):
        PlanSettings(gpus=4, batch=0)


def test_a_history_without_features_or_workloads_plans(tmp_path: Path) -> None:
    """What a router writes: string ids, no prompt features, no workload."""
    path = tmp_path / "router.jsonl"
    records = [
        TrajectoryRecord(
            trajectory_id=f"t-{i}",
            prompt_id=f"p-{i % 5}",
            turns=(
                TurnRecord(input_tokens=600, output_tokens=200 + 97 * i, tool_latency_s=2.0),
                TurnRecord(input_tokens=50, output_tokens=100),
            ),
        )
        for i in range(20)
    ]
    write_history(path, records)
    plan = plan_json("--gpus", "4", "--history", str(path))
    assert sum(plan["degrees"]) == 4 and plan["trajectories"] == 20


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "3", "--degrees", "2,4"], "3 GPUs cannot be split into workers"),
        (["--gpus", "0"], "gpus, max_running and gpus_per_node must be >= 1"),
        (["--gpus", "8", "--degrees", "1,x"], "not a list of integers"),
        # 3 neither divides Qwen3-14B's 8 KV heads nor is a multiple of them (16 is: vLLM
        # replicates the heads)
        (["--gpus", "8", "--degrees", "3"], "no degree in (3,)"),
        (["--gpus", "8", "--model", "gpt-9"], "unknown model 'gpt-9'"),
        (["--gpus", "8", "--gpu", "tpu"], "unknown GPU type 'tpu'"),
    ],
)
def test_bad_options(history: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["plan", "rollout", "--history", str(history), *args])
    assert result.exit_code == 2
    assert message in said(result)


def test_bad_profiles(history: Path, tmp_path: Path) -> None:
    base = ["plan", "rollout", "--gpus", "8", "--history", str(history)]
    (small,) = profiles(tmp_path, (1,), kv=1000)
    result = runner.invoke(app, [*base, "--profile", small])
    assert result.exit_code == 2
    assert "no degree in (1, 2, 4, 8) is profiled and holds" in said(result)
    assert "tp=1 holds 1,000" in said(result)
    result = runner.invoke(app, [*base, "--profile", small, "--model", "qwen3-8b"])
    assert result.exit_code == 2 and "--profile replaces it" in said(result)


def test_bad_histories(tmp_path: Path, history: Path) -> None:
    def run(path: Path) -> Result:
        return runner.invoke(app, ["plan", "rollout", "--gpus", "4", "--history", str(path)])

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = run(empty)
    assert result.exit_code == 2 and "holds no trajectories" in said(result)
    broken = tmp_path / "broken.jsonl"
    lines = history.read_text().splitlines()
    broken.write_text("\n".join([lines[0], '{"trajectory_id": "x"}', *lines[1:]]) + "\n")
    result = run(broken)
    assert result.exit_code == 2
    assert "broken.jsonl:2: not a trajectory record" in said(result)
    result = run(tmp_path / "missing.jsonl")
    assert result.exit_code == 2 and "cannot read history" in said(result)


def test_example_history_refuses_an_unknown_workload(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["plan", "example-history", str(tmp_path / "h.jsonl"), "--workload", "chess"]
    )
    assert result.exit_code == 2 and "'chess' is not one of" in said(result)
    result = runner.invoke(
        app, ["plan", "example-history", str(tmp_path / "h.jsonl"), "--model", "gpt-9"]
    )
    assert result.exit_code == 2 and "model 'gpt-9'" in said(result)


def test_a_simulated_plan_keeps_the_layout_that_serves_the_batch_fastest(history: Path) -> None:
    """With `simulate`, the annealed layout and every uniform one serve the batch in the
    simulator; the plan keeps the fastest, each makespan as `served_on` gives it alone."""
    from loom.core.topology import GpuType
    from loom.rollout.heddle.predictor import ProgressivePredictor
    from loom.sim.rollout.layouts import Fleet, renumbered, served_on

    trajs = read_history(history)
    settings = PlanSettings(gpus=4, degrees=(1, 2, 4), max_running=1024, simulate=True)
    plan = plan_rollout(trajs, settings)
    spans = dict(plan.simulated)
    assert plan.annealed in spans and {(1,) * 4, (2, 2), (4,)} <= set(spans)
    assert spans[plan.degrees] == min(spans.values())
    specs = renumbered(trajs)
    predictions = ProgressivePredictor().fit(trajs).predict_steps(specs)
    fleet = Fleet(model="qwen3-14b", gpu=GpuType.H100, gpus=4, max_running=1024)
    alone = served_on(specs, plan.degrees, fleet, predictions=predictions, history=trajs)
    assert alone.makespan_s == spans[plan.degrees]  # deterministic, and what it reports
    assert plan.to_json()["simulated"] and plan_table(plan).caption.count("simulator") == 1
    with pytest.raises(ConfigError, match="not on profiles"):
        PlanSettings(gpus=4, simulate=True, profiles=(history,))
