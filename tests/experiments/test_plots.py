"""Plots a reader can judge at a glance: the paper's value beside Loom's wherever the paper
states one (a black marker on a bar, a dashed line beside a line, a bracket for a range), and
units on every axis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib.collections import PathCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from typer.testing import CliRunner

from loom.cli import app
from loom.core.trajectory import WorkloadKind
from loom.experiments import heddle, plexrl, report, rollmux, rose, tangram
from loom.experiments.report import bar_figure, line_figure

ROWS = [
    {"workload": w, "policy": p, "speedup": v, "paper_speedup": paper}
    for w, p, v, paper in (
        ("coding", "heddle", 2.0, 2.5),
        ("coding", "verl", 1.0, None),
        ("search", "heddle", 1.5, float("nan")),
        ("search", "verl", 1.0, None),
    )
]


def _paper_marks(fig: Figure) -> list[tuple[float, float]]:
    return [
        (float(x), float(y))
        for ax in fig.axes
        for c in ax.collections
        if isinstance(c, PathCollection) and c.get_label() == "paper"
        for x, y in c.get_offsets()
    ]


def _bar_x(fig: Figure, label: str) -> list[float]:
    ax = fig.axes[0]
    bars = next(c for c in ax.containers if c.get_label() == label)
    return [b.get_x() + b.get_width() / 2 for b in bars]


def test_bar_figure_marks_the_papers_value_on_its_bar_and_labels_units() -> None:
    fig = bar_figure(
        ROWS,
        x="workload",
        hue="policy",
        metric="speedup",
        paper="paper_speedup",
        ylabel="speedup over verl (×)",
        title="t",
    )
    # one marker: coding/heddle's stated 2.5; NaN and None state nothing
    assert _paper_marks(fig) == [(pytest.approx(_bar_x(fig, "heddle")[0]), 2.5)]
    ax = fig.axes[0]
    assert ax.get_ylabel() == "speedup over verl (×)" and ax.get_xlabel() == "workload"
    assert "paper" in ax.get_legend_handles_labels()[1]


def test_bar_figure_without_a_paper_column_draws_no_marker() -> None:
    fig = bar_figure(ROWS, x="workload", hue="policy", metric="speedup", ylabel="speedup (×)")
    assert _paper_marks(fig) == []
    assert "paper" not in fig.axes[0].get_legend_handles_labels()[1]


def test_bar_figure_draws_a_stated_range_as_a_bracket() -> None:
    rows = [{**r, "paper_speedup": (1.4, 2.3) if r["policy"] == "heddle" else None} for r in ROWS]
    fig = bar_figure(
        rows, x="workload", hue="policy", metric="speedup", paper="paper_speedup", ylabel="(×)"
    )
    ax = fig.axes[0]
    (bracket,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert bracket.get_label() == "paper (range)"
    segments = bracket.lines[2][0].get_segments()
    assert [(s[0][1], s[1][1]) for s in segments] == [
        pytest.approx((1.4, 2.3)),
        pytest.approx((1.4, 2.3)),
    ]


def test_line_figure_draws_the_papers_series_dashed_beside_loom_s() -> None:
    rows = [
        {"model": "8b", "algo": "grpo", "lent_gpus": n, "speedup": s, "paper_speedup": p}
        for n, s, p in ((0, 1.0, 1.0), (4, 1.2, 1.26), (8, 1.3, None), (16, 1.5, 1.69))
    ]
    fig = line_figure(
        rows,
        x="lent_gpus",
        metric="speedup",
        hue="algo",
        facet="model",
        paper="paper_speedup",
        xlabel="lent GPUs (GPUs)",
        ylabel="speedup (×)",
    )
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"grpo", "grpo (paper)"}
    paper = lines["grpo (paper)"]
    assert paper.get_linestyle() == "--" and paper.get_color() == "black"
    assert list(paper.get_xdata()) == [0.0, 4.0, 16.0]
    assert list(paper.get_ydata()) == [1.0, 1.26, 1.69]
    assert list(lines["grpo"].get_ydata()) == [1.0, 1.2, 1.3, 1.5]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("lent GPUs (GPUs)", "speedup (×)")


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Every figure a plot function saves, kept open for inspection."""
    kept: list[Figure] = []

    def keep(fig: Figure, path: Path) -> Path:
        kept.append(fig)
        return path

    monkeypatch.setattr(report, "save_figure", keep)
    return kept


def _assert_units(figs: list[Figure]) -> None:
    assert figs
    for fig in figs:
        for ax in fig.axes:
            title = fig.get_suptitle()
            assert ax.get_ylabel().endswith(")"), (title, ax.get_ylabel())
            assert "(" in ax.get_ylabel() and ax.get_xlabel(), (title, ax.get_xlabel())


def test_plexrl_plots_carry_units_and_the_papers_figures(
    figures: list[Figure], tmp_path: Path
) -> None:
    records = plexrl.table2_records() + plexrl.fig7c_records(1)
    plexrl.plot(records, tmp_path)
    _assert_units(figures)
    by_title = {f.get_suptitle(): f for f in figures}
    table2 = by_title["Table 2: training-pool bubble ratio"]
    stated = sorted(r["paper_bubble_ratio"] for r in records if r["experiment"] == "table2")
    assert sorted(y for _, y in _paper_marks(table2)) == pytest.approx(stated)
    fig7c = by_title["Fig. 7c: real / saturated throughput AUC"]
    assert sorted(y for _, y in _paper_marks(fig7c)) == pytest.approx(
        sorted(plexrl.FIG7C_PAPER.values())
    )


def test_rose_plots_carry_units_and_the_papers_figures(
    figures: list[Figure], tmp_path: Path
) -> None:
    records: list[dict[str, Any]] = []
    for key, model in (("8b", "qwen3-8b"), ("32b", "qwen3-32b")):
        base = {"model": model, "policy": "rose", "algo": "grpo"}
        paper_s = rose.TABLE1_PAPER[(key, "rose")][0]
        records += [
            {**base, "experiment": "fig14", "lent_gpus": 4, "rollout_time_s": 2.0, "speedup": 1.1},
            {**base, "experiment": "table1", "rollout_time_s": 9.0, "ttft_p99_ms": 300.0}
            | {"paper_rollout_time_s": paper_s, "paper_p99_ms": 1.0},
        ]
    rose.plot(records, Path("unused"))
    _assert_units(figures)
    table1 = next(f for f in figures if f.get_suptitle() == "Table 1: rollout time")
    assert sorted(y for _, y in _paper_marks(table1)) == [496.3, 960.1]


def test_reproduce_json_dash_prints_the_records_alone(tmp_path: Path) -> None:
    args = ["reproduce", "plexrl", "--quick", "--only", "table2", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, [*args, "--json", "-"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["system"], doc["seed"], doc["quick"]) == ("plexrl", 1, True)
    table2 = [r for r in doc["records"] if r["experiment"] == "table2"]
    assert len(table2) == 3 and all("paper_bubble_ratio" in r for r in table2)
    assert "wrote" in result.stderr


def test_json_records_are_strict_json(tmp_path: Path) -> None:
    """A metric that is not a finite number is null: strict parsers reject NaN."""
    import numpy as np

    records = [
        {"experiment": "e", "ratio": float("nan"), "top": float("inf"), "n": 3},
        {"experiment": "e", "ratio": np.float32(0.5), "runs": [1.0, float("nan")]},
    ]
    report.write_json(tmp_path / "r.json", "heddle", 1, True, records)

    def strict(token: str) -> None:
        raise ValueError(f"not strict JSON: {token}")

    doc = json.loads((tmp_path / "r.json").read_text(), parse_constant=strict)
    assert doc["records"][0] == {"experiment": "e", "ratio": None, "top": None, "n": 3}
    assert doc["records"][1] == {"experiment": "e", "ratio": 0.5, "runs": [1.0, None]}


def test_rollmux_plots_carry_units_and_the_papers_figures(
    figures: list[Figure], tmp_path: Path
) -> None:
    rows = [r for r in rollmux.fig10_table4(1, True) if r["experiment"] != "fig10_gantt"]
    rollmux.plot(rows + rollmux.fig12(1, True), tmp_path)
    _assert_units(figures)
    table4 = next(f for f in figures if f.get_suptitle().startswith("Table 4"))
    stated = [v for bench in rollmux.TABLE4_PAPER.values() for v in bench.values()]
    assert sorted(y for _, y in _paper_marks(table4)) == pytest.approx(sorted(stated))
    gain = next(f for f in figures if "gain" in f.get_suptitle())
    stated = [v for bench in rollmux.FIG10_PAPER_GAIN.values() for v in bench.values()]
    assert sorted(y for _, y in _paper_marks(gain)) == pytest.approx(sorted(stated))


def test_heddle_speedups_stand_beside_the_papers_ranges(
    figures: list[Figure], tmp_path: Path
) -> None:
    summary = [
        {
            "experiment": "summary",
            "workload": w,
            "model": "qwen3-14b",
            "policy": "heddle",
            "vs_verl": 1.5,
            "vs_slime": 1.3,
            "vs_verl_star": 1.2,
        }
        for w in ("coding", "search")
    ]
    table2 = [
        {"experiment": "table2", "workload": "coding", "model": "qwen3-14b", "policy": p}
        | {
            "decision_ms": 10.0,
            "paper_decision_ms": heddle._paper_ms("qwen3-14b", p, WorkloadKind.CODING),
        }
        for p in ("placement", "resource_manager")
    ]
    heddle.plot(summary + table2, tmp_path)
    _assert_units(figures)
    fig = next(f for f in figures if f.get_suptitle().startswith("Fig. 12"))
    (bracket,) = [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
    spans = sorted(
        (round(s[0][1], 9), round(s[1][1], 9)) for s in bracket.lines[2][0].get_segments()
    )
    assert spans == sorted(2 * list(heddle.SPEEDUP_PAPER["fig12"].values()))
    t2 = next(f for f in figures if f.get_suptitle().startswith("Table 2"))
    assert sorted(y for _, y in _paper_marks(t2)) == pytest.approx([38.0, 5050.0])


def test_tangram_headlines_stand_beside_the_papers_ratios(
    figures: list[Figure], tmp_path: Path
) -> None:
    nan = float("nan")
    summary = [
        {"experiment": "summary", "policy": "tangram", "metric": m, "workload": "coding"}
        | {"value": v, "paper": p, "target": ""}
        for m, v, p in (
            ("traj_act_ratio_vs_k8s", 2.1, 4.3),
            ("step_speedup", 0.9, 1.4),
            ("avg_act_ratio_vs_k8s", 2.1, nan),
        )
    ]
    tangram.plot(summary, tmp_path)
    _assert_units(figures)
    (fig,) = figures
    assert sorted(y for _, y in _paper_marks(fig)) == [1.4, 4.3]
    assert fig.axes[0].get_yscale() == "log"
