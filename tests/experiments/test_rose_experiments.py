"""ROSE's evaluation loop on a tiny workload: the one-step off-policy timeline, DAPO's valid
batch, AReaL's stream, determinism, the serving calibration, the lent slice, bad input, the
summary and plots, and a quick `loom reproduce rose` run."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from loom.cli import app
from loom.core.errors import ConfigError
from loom.experiments import rose as ex
from loom.experiments import rose_steps as steps
from loom.rollout.rose.admission import Role
from loom.rollout.rose.memory import MemorySharing
from loom.sim.workloads.rose import ROSE_WORKLOADS, Algorithm, train_time_s
from loom.sim.workloads.serving import synthetic_day

WL = ROSE_WORKLOADS["8b"]
# Two groups per step, two dedicated GPUs, four lent ones (one prefiller, three decoders).
TINY = replace(WL, batch=32, rollout_gpus=2, max_lent_gpus=4)


def spy_rollouts(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record each step's rollout call (its keyword arguments) and result."""
    calls: list[dict[str, Any]] = []
    real = steps._rollout

    def spy(*args: Any, **kw: Any) -> Any:
        res = real(*args, **kw)
        calls.append({**kw, "result": res})
        return res

    monkeypatch.setattr(steps, "_rollout", spy)
    return calls


# ---- the step loop ---------------------------------------------------------------------------
def test_grpo_runs_one_step_off_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_rollouts(monkeypatch)
    run = ex.train(TINY, ex.ROSE, ex.Algo.GRPO, 4, seed=1)
    assert len(run.steps) == len(calls) == 4
    ends = [s.train_end_s for s in run.steps]
    assert all(b > a for a, b in itertools.pairwise(ends))
    delay = steps.transfer_s(TINY)
    for s, (step, call) in enumerate(zip(run.steps, calls, strict=True)):
        start = call["start_s"]
        rollout_before = calls[s - 1]["start_s"] + run.steps[s - 1].rollout_s if s else 0.0
        trained = ends[s - 2] if s >= 2 else 0.0
        assert start >= trained - 1e-9, f"step {s} rolls out before step {s - 2} trained"
        assert start == pytest.approx(max(rollout_before, trained))
        assert call["weights_delay_s"] == pytest.approx(max(0.0, trained + delay - start))
        res = call["result"]
        assert step.rollout_s == res.makespan_s and step.tokens == res.kept_tokens
        assert res.kept == TINY.batch
        assert step.train_end_s == pytest.approx(
            max(start + res.makespan_s, ends[s - 1] if s else 0.0)
            + train_time_s(replace(TINY, seed=1), res.kept_tokens)
        )
    assert np.all(run.step_times > 0) and run.mean_throughput() > 0


def test_dapo_trains_exactly_the_batch_of_valid_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_rollouts(monkeypatch)
    run = ex.train(TINY, ex.ROSE, ex.Algo.DAPO, 3, seed=1)
    need = TINY.batch // TINY.group
    most = steps.DAPO_MAX_MULTIPLE * need
    full = 0
    for call in calls:
        res, stats = call["result"], call["feed"].stats
        assert res.launched <= most * TINY.group and res.launched % TINY.group == 0
        if stats["valid"] >= need:
            full += 1
            assert res.kept == TINY.batch
        else:  # every allowed group launched and finished without enough valid ones
            assert stats["launched"] == stats["finished"] == most
            assert res.kept == stats["valid"] * TINY.group
    assert full >= 2, "the scenario must fill the batch in most steps"
    assert [s.tokens for s in run.steps] == [c["result"].kept_tokens for c in calls]


def test_areal_trains_each_batch_as_it_completes() -> None:
    steps = 3
    run = ex.train(TINY, ex.ROSE, ex.Algo.AREAL, steps, seed=2)
    res = run.steps[0].result
    toks = res.kept_tokens_by_finish
    assert len(toks) == res.kept == steps * TINY.batch
    assert res.launched > res.kept, "the stream keeps trajectories alive past the last batch"
    order = np.sort(res.finish_s)
    for k, step in enumerate(run.steps):
        assert step.tokens == sum(toks[k * TINY.batch : (k + 1) * TINY.batch])
        assert step.rollout_s == order[(k + 1) * TINY.batch - 1]
    ends = [s.train_end_s for s in run.steps]
    assert all(b > a for a, b in itertools.pairwise(ends))


def test_the_same_seed_trains_the_same_run() -> None:
    a, b = (ex.train(TINY, ex.ROSE, ex.Algo.GRPO, 2, seed=3) for _ in range(2))
    assert [s.train_end_s for s in a.steps] == [s.train_end_s for s in b.steps]
    for x, y in zip(a.serving(), b.serving(), strict=True):
        assert len(x) > 0 and np.array_equal(x, y)
    c = ex.train(TINY, ex.ROSE, ex.Algo.GRPO, 2, seed=4)
    assert [s.train_end_s for s in c.steps] != [s.train_end_s for s in a.steps]


# ---- the lent slice and its serving load -----------------------------------------------------
@pytest.mark.parametrize(("key", "instances", "tp"), [("8b", 16, 1), ("32b", 16, 4)])
def test_lent_instances_are_one_prefiller_to_three_decoders(
    key: str, instances: int, tp: int
) -> None:
    wl = ROSE_WORKLOADS[key]
    lent = steps.lent_instances(wl, ex.ROSE)
    assert len(lent) == instances and {i.tp for i in lent} == {tp}
    roles = [i.config.role for i in lent]
    assert roles.count(Role.PREFILL) * 3 == roles.count(Role.DECODE)
    assert len({id(i.memory) for i in lent}) == len(lent), "each instance has its own pool"
    assert all(isinstance(i.memory, MemorySharing) for i in lent)
    mem = lent[0].config.memory
    assert 0 < mem.headroom_pages < mem.pool_pages
    assert steps.lent_instances(wl, replace(ex.ROSE, lent_gpus=0)) == []
    assert len(steps.lent_instances(wl, replace(ex.ROSE, lent_gpus=2 * tp))) == 2
    no_cache = steps.lent_instances(wl, replace(ex.ROSE, prefix_cache=False))
    assert no_cache[0].config.memory.lease_s == 0.0


def test_serving_alone_meets_its_slo_at_fig_3b_load() -> None:
    """The lent slice serving its share of the day alone (Table 1's no-rollout row) keeps the
    TTFT SLO with room to spare, and its rate grows with the prefillers it has."""
    gpus = WL.max_lent_gpus
    day = synthetic_day(mean_rps=steps.serving_rate(WL, gpus), hours=24.0, seed=0)
    res = ex.serving_alone(WL, gpus, day)
    p99 = float(np.percentile(res.ttft_s, 99))
    assert len(res.ttft_s) > 1_000
    assert p99 < WL.slo_ttft_s, f"TTFT P99 {p99 * 1e3:.1f} ms"
    assert steps.serving_rate(WL, 8) == pytest.approx(steps.serving_rate(WL, 16) / 2)
    assert steps.serving_rate(WL, 0) == 0.0


# ---- training steps and bad input ------------------------------------------------------------
@pytest.mark.parametrize("steps", [0, -1])
def test_training_steps_needs_a_step(steps: int) -> None:
    with pytest.raises(ConfigError, match="steps must be >= 1"):
        ex.training_steps(WL, ex.Algo.GRPO, steps)


@pytest.mark.parametrize("algo", list(ex.Algo))
def test_training_steps_spread_over_training(algo: ex.Algo) -> None:
    total = WL.steps[Algorithm.DAPO if algo == ex.Algo.DAPO else Algorithm.GRPO]
    for n in (1, 3, 7):
        ids = ex.training_steps(WL, algo, n)
        assert len(ids) == n and ids == sorted(set(ids)) and ids[0] == 0
        if n > 1:
            assert ids[-1] == total - 1
            gaps = np.diff(ids)
            assert gaps.max() - gaps.min() <= 1, "evenly spread"
    assert ex.training_steps(WL, algo, 10 * total) == list(range(total))


# ---- experiments, summary, plots, CLI --------------------------------------------------------
def test_run_experiments_lists_every_experiment() -> None:
    total, tasks = ex.run_experiments(seed=1, quick=True)
    labels = [label for label, _ in tasks]
    assert len(labels) == total
    names = {label.split()[0] for label in labels}
    assert names == {
        "fig7",
        "fig8",
        "fig14",
        "table3",
        "table1",
        "table2",
        "fig9",
        "table4",
        "table5",
        "fig12",
        "fig10",
    }
    assert len(labels) == len(set(labels))


def test_summary_puts_ours_beside_the_paper() -> None:
    records = [
        {"experiment": "fig7", "model": "m", "policy": "rose", "algo": "grpo", "speedup": 1.3,
         "paper_speedup": 1.31, "baseline": "roll_grpo"},
        {"experiment": "fig7", "model": "m", "policy": "roll_grpo", "algo": "grpo",
         "speedup": 1.0, "paper_speedup": 1.0, "baseline": "roll_grpo"},
        {"experiment": "fig14", "model": "m", "policy": "rose+4", "lent_gpus": 4,
         "speedup": 2.0, "paper_speedup": 1.26},
        {"experiment": "fig10", "model": "m", "policy": "sparse", "speedup_vs_batch": 4.0,
         "paper_speedup": 4.4},
        {"experiment": "fig9", "model": "m", "policy": "dual_slo", "density": 1.0,
         "ttft_violations": 0, "tpot_violations": 0},
        {"experiment": "fig9", "model": "m", "policy": "none@x3", "density": 3.0,
         "ttft_violations": 7, "tpot_violations": 2},
        {"experiment": "fig9", "model": "m", "policy": "tpot_only", "density": 1.0,
         "ttft_violations": 5},
        {"experiment": "table1", "model": "m", "policy": "rose", "rollout_vs_rose": 1.0,
         "paper_rollout_vs_rose": 1.0},
        {"experiment": "table1", "model": "m", "policy": "serverlessllm",
         "rollout_vs_rose": 1.25, "paper_rollout_vs_rose": 1.31},
        {"experiment": "table1", "model": "m", "policy": "serverlessllm@keepalive0",
         "rollout_vs_rose": 2.0, "paper_rollout_vs_rose": None},
    ]  # fmt: skip
    rows = ex.summary(records)
    got = {(r["of"], r["policy"]): r for r in rows}
    assert set(got) == {
        ("fig7", "rose"),
        ("fig14", "rose+4"),
        ("fig10", "sparse"),
        ("fig9", "dual_slo"),
        ("fig9", "none@x3"),
        ("table1", "serverlessllm"),
    }
    assert all(r["experiment"] == "summary" for r in rows)
    assert got[("fig7", "rose")]["within_15pct"] is True
    assert got[("fig7", "rose")]["variant"] == "roll_grpo"
    assert got[("fig14", "rose+4")]["within_15pct"] is False
    assert got[("fig14", "rose+4")]["variant"] == 4
    assert got[("fig10", "sparse")]["speedup"] == 4.0
    # fig9: requests over the SLO, which ROSE's admission must keep at zero
    assert got[("fig9", "dual_slo")]["speedup"] == 0.0 == got[("fig9", "dual_slo")]["paper"]
    assert got[("fig9", "none@x3")]["speedup"] == 9.0
    assert got[("table1", "serverlessllm")]["within_15pct"] is True


def test_plot_draws_every_experiment(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = []
    for model in ("qwen3-8b", "qwen3-32b"):
        base = {"model": model, "policy": "rose", "algo": "grpo"}
        records += [
            {**base, "experiment": "fig7", "baseline": "roll_grpo", "throughput_tok_s": 1.0}
            | {"speedup": 1.3},
            {**base, "experiment": "fig8", "rollout_time_s": 1.0, "speedup": 1.2}
            | {"preempted_gpu_frac": 0.01},
            {**base, "experiment": "fig10b", "bandwidth_gbps": 200.0, "transfer_s": 8.0},
            {**base, "experiment": "fig14", "lent_gpus": 4, "rollout_time_s": 2.0, "speedup": 1.0},
            {**base, "experiment": "fig12", "per_gpu_batch": 16, "throughput_tok_s": 3.0},
            {**base, "experiment": "fig9", "tpot_p99_ms": 100.0},
            {**base, "experiment": "table2", "rollout_time_s": 90.0, "tpot_p99_ms": 100.0},
            {**base, "experiment": "table5", "ttft_p99_ms": 300.0, "rollout_time_s": 90.0},
            {**base, "experiment": "fig10", "transfer_s": 8.0},
        ]
    paths = ex.plot(records, tmp_path)
    names = {"fig7", "fig8", "fig14", "fig12", "fig9", "table2", "table5", "fig10", "fig10b"}
    names |= {"fig7_speedup", "fig8_speedup", "fig8b", "fig14_speedup"}
    names |= {"table2_tpot", "table5_rollout"}
    assert {p.name for p in paths} == {f"{n}.png" for n in names}
    assert all(p.stat().st_size > 0 for p in paths)


def test_quick_reproduce_of_the_cheap_experiments_writes_the_contract(tmp_path: Path) -> None:
    out = tmp_path / "rose.json"
    result = CliRunner().invoke(
        app,
        [
            "reproduce",
            "rose",
            "--quick",
            "--only",
            "fig12,fig10",
            "--out",
            str(tmp_path),
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["system"] == "rose" and doc["quick"] is True
    records = doc["records"]
    assert {r["experiment"] for r in records} >= {"fig12", "fig10", "summary"}
    for r in records:
        assert {"experiment", "policy", "model"} <= set(r), r
    fig12 = [r for r in records if r["experiment"] == "fig12"]
    assert [r["per_gpu_batch"] for r in fig12] == [1, 2, 4, 8, 16, 32, 64]
    assert all(r["throughput_tok_s"] > 0 for r in fig12)
    assert (tmp_path / "rose" / "fig12.png").stat().st_size > 0


@pytest.mark.slow
def test_table1_records_hold_the_contract_and_serverlessllm_violates_when_it_swaps(
    tmp_path: Path,
) -> None:
    out = tmp_path / "rose.json"
    args = ["reproduce", "rose", "--quick", "--only", "table1", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = [r for r in json.loads(out.read_text())["records"] if r["experiment"] == "table1"]
    for model in ("qwen3-8b", "qwen3-32b"):
        mine = {r["policy"]: r for r in rows if r["model"] == model}
        assert {"rose", "serverlessllm", "prism"} <= set(mine)
        for policy in ("rose", "serverlessllm", "prism"):
            r = mine[policy]
            for field in ("rollout_time_s", "ttft_p99_ms", "tpot_p99_ms", "slo_violations"):
                assert field in r, (policy, field)
        assert mine["rose"]["slo_violations"] == 0
        # scaled down the moment serving idles, every arrival waits for a reload
        assert mine["serverlessllm@keepalive0"]["slo_violations"] > 0
        assert mine["serverlessllm"]["rollout_time_s"] > mine["rose"]["rollout_time_s"]
