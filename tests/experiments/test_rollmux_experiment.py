"""RollMux reproduce pipeline: record contract and determinism on the quick scale."""

import itertools
import json

import pytest
from typer.testing import CliRunner

from loom.cli import app
from loom.experiments import rollmux
from loom.experiments.registry import SYSTEMS


def test_registered():
    assert "rollmux" in SYSTEMS


def test_fig15_records_follow_the_contract_and_are_deterministic():
    a, b = rollmux.fig15(2, True), rollmux.fig15(2, True)
    assert a == b
    assert {r["policy"] for r in a} == {"rollmux", "rollmux_slo_prune", "random", "greedy", "opt"}
    for r in a:
        assert r["experiment"] == "fig15" and {
            "cost_per_h",
            "cost_vs_opt",
            "slo_attainment",
        } <= set(r)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rollmux_meets_every_slo(seed):
    """§4.2: every job's co-executed iteration time stays within SLO x its estimated
    (worst-case) solo iteration time."""
    rm = next(r for r in rollmux.fig15(seed, True) if r["policy"] == "rollmux")
    assert rm["slo_attainment"] == 1.0


def test_fig12_topology_aware_is_faster():
    assert all(r["speedup_x"] > 1 for r in rollmux.fig12(1, True))


def test_fig10_gantt_charts_both_pools(tmp_path):
    rows = rollmux.fig10_table4(1, True)
    gantt = [r for r in rows if r["experiment"] == "fig10_gantt"]
    assert {r["benchmark"] for r in gantt} == set(rollmux.MICRO)
    for bench, types in rollmux.MICRO.items():
        mine = [r for r in gantt if r["benchmark"] == bench]
        assert len(mine) == 2 * rollmux.GANTT_ITERATIONS * len(types)
        lanes: dict[tuple[object, str], list[tuple[float, float]]] = {}
        for r in mine:
            busy_until = r["end_s"] if r["tail_start_s"] is None else r["head_end_s"]
            for node in str(r["nodes"]).split(","):
                lanes.setdefault((r["group"], node), []).append((r["start_s"], busy_until))
        for spans in lanes.values():
            spans.sort()
            assert all(b[0] >= a[1] - 1e-9 for a, b in itertools.pairwise(spans))
    paths = rollmux.plot(rows, tmp_path)
    for bench in rollmux.MICRO:
        assert tmp_path / f"fig10_gantt_{bench}.png" in paths
        assert (tmp_path / f"fig10_gantt_{bench}.png").stat().st_size > 0


def test_testbed_compares_against_solo_d_and_verl():
    rows = {r["policy"]: r for r in rollmux.testbed_cmp(1, True)}
    assert set(rows) == {"rollmux", "solo_d", "verl", "gavel_plus", "opt"}
    assert rows["solo_d"]["solo_d_cost_over_this_x"] == 1.0
    assert rows["verl"]["verl_cost_over_this_x"] == 1.0
    assert rows["verl"]["peak_rollout_gpus"] == 0
    assert rows["rollmux"]["slo_attainment"] == 1.0
    assert rows["rollmux"]["solo_d_cost_over_this_x"] > 1.0


def test_only_runs_the_named_experiments_and_rejects_unknown_ones(tmp_path):
    path = tmp_path / "r.json"
    args = ["reproduce", "rollmux", "--quick", "--out", str(tmp_path), "--json", str(path)]
    result = CliRunner().invoke(app, [*args, "--only", "fig12"])
    assert result.exit_code == 0, result.output
    records = json.loads(path.read_text())["records"]
    assert {r["experiment"] for r in records} <= {"fig12", "summary"}
    assert any(r["experiment"] == "fig12" for r in records)
    bad = CliRunner().invoke(app, [*args, "--only", "fig99"])
    assert bad.exit_code != 0
    assert "fig99" in bad.output and "fig14b" in bad.output
