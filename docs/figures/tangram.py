"""ARL-Tangram's figures in the docs, from stored `loom reproduce tangram --json` results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from figures.core import Result, claims_table, para, pct, result, run_label, span, table, wins, x

__all__ = [
    "tangram_calibration",
    "tangram_fig9",
    "tangram_fig9_dop4",
    "tangram_headlines",
    "tangram_stage",
    "tangram_steps",
    "tangram_summary",
    "tangram_table1",
]

# §6.2 (Fig. 7's breakdown): AI coding's environment and reward stages shorten "by 9.0x and
# 2.8x, respectively and 4.3x in total" against the k8s baseline.
STAGE_PAPER = {"tool_s": 9.0, "reward_s": 2.8}
FULL = "five nodes"  # a full run's label: §6.3's testbed


def _fig7(r: Result, workload: str, policy: str) -> dict[str, Any] | None:
    rows = r.where(experiment="fig7", workload=workload, policy=policy)
    return rows[0] if len(rows) == 1 else None


def tangram_stage(r: Result, field: str) -> float | None:
    """A coding stage's time per trajectory under `k8s` over Tangram's (Fig. 7)."""
    k8s, tangram = _fig7(r, "coding", "k8s"), _fig7(r, "coding", "tangram")
    return None if k8s is None or tangram is None else k8s[field] / tangram[field]


def tangram_summary(r: Result, metric: str, **match: Any) -> dict[str, Any] | None:
    """Tangram's summary row of `metric` (None where the run has none)."""
    rows = r.where(experiment="summary", policy="tangram", metric=metric, **match)
    return rows[0] if len(rows) == 1 else None


def _value(metric: str, fmt: Any = x, **match: Any) -> Any:
    def figure(r: Result) -> str | None:
        row = tangram_summary(r, metric, **match)
        return None if row is None or row["value"] is None else fmt(row["value"])

    return figure


def _paper(names: Sequence[str], metric: str, fmt: Any = x, **match: Any) -> str | None:
    """The paper's figure as the experiment's summary holds it, from the first run that has
    the row (None where none has)."""
    for n in names:
        row = tangram_summary(result(n), metric, **match)
        if row is not None and row["paper"] is not None:
            return str(fmt(row["paper"]))
    return None


def tangram_headlines(names: Sequence[str]) -> None:
    """Each ratio the paper states (§6.2-6.4), beside Loom's in each run: the baseline's over
    Tangram's, so above 1 is a gain. A claim no run holds a record of is left out."""
    summary = [
        (
            "Fig. 7, coding: trajectory's action time over `k8s`",
            "traj_act_ratio_vs_k8s",
            x,
            {"workload": "coding"},
        ),
        ("§6.2, coding: step time over `k8s`", "step_speedup", x, {"workload": "coding"}),
        (
            "§6.2, deep search: step time over independent API quotas",
            "step_speedup",
            x,
            {"workload": "deepsearch"},
        ),
        *(
            (
                f"Fig. 9, {cores} cores: over DoP {dop} at batch {b:,}",
                f"fig9_act_ratio_vs_dop{dop}",
                x,
                {"batch_size": b, "cpu_cores": cores},
            )
            for cores in (256, 512)
            for dop, b in ((4, 256), (16, 1280))
        ),
        *(
            (
                f"Fig. 8b: GPU action time over {label}, batch {b:,}",
                f"gpu_act_ratio_vs_{base}",
                x,
                {"batch_size": b},
            )
            for base, label, b in (
                ("sglang_static", "static SGLang", 1024),
                ("serverlessllm", "ServerlessLLM", 1024),
                ("sglang_static", "static SGLang", 2048),
            )
        ),
        (
            "§6.3: share of the GPUs Tangram needs to match static SGLang's action time",
            "gpu_fraction_at_equal_act",
            pct,
            {},
        ),
    ]
    claims = []
    for label, metric, fmt, match in summary:
        paper = _paper(names, metric, _px if fmt is x else fmt, **match)
        if paper is not None:
            claims.append((label, paper, _value(metric, fmt, **match)))
    stages = [
        (
            f"Fig. 7, coding: {stage} stage over `k8s`",
            x(STAGE_PAPER[field], 1),
            lambda r, field=field: _opt(tangram_stage(r, field)),
        )
        for stage, field in (("environment", "tool_s"), ("reward", "reward_s"))
    ]
    claims_table(names, [claims[0], *stages, *claims[1:]], full=FULL)


def _px(v: Any) -> str:
    """A ratio as the paper states it, to one decimal: 4.3x."""
    return f"{float(v):.1f}x"


def _opt(v: float | None) -> str | None:
    return None if v is None else x(v)


def tangram_steps(names: Sequence[str]) -> None:
    """A sentence: in how many runs Tangram's coding step is shorter than `k8s`'s."""
    steps = [tangram_summary(result(n), "step_speedup", workload="coding")["value"] for n in names]
    para(
        f"Tangram's coding step is shorter than `k8s`'s in {wins(steps)} runs "
        f"({span(steps, unit='x')}; paper 1.4x)."
    )


def tangram_calibration(names: Sequence[str]) -> None:
    """The two parameters the coding workload is calibrated with (`CodingParams`), then the
    two measurements they are calibrated to, per run: Table 1's mean execution per coding
    action under Tangram (its first cell: batch 1280 at five nodes, scaled at `--quick`) and
    Fig. 3(c)'s share of a trajectory's life spent in actions under `k8s`."""
    from loom.sim.workloads.actions import CodingParams

    p = CodingParams()
    para(
        f"They set the reward's median single-core time to {p.reward_median_s:g} s and the "
        f"LLM's time per turn to {p.llm_median_s:g} s (`CodingParams`). Each run against the two:"
    )
    rows = []
    for n in names:
        r = result(n)
        cell = min(r.where(experiment="table1", workload="coding"), key=lambda c: c["batch_size"])
        k8s = _fig7(r, "coding", "k8s")
        assert k8s is not None
        rows.append(
            [
                run_label(n, FULL),
                f"{cell['exec_s']:.2f} s (batch {cell['batch_size']:,})",
                pct(k8s["traj_act_s"] / k8s["traj_s"], 1),
            ]
        )
    table(
        ["run", "execution per coding action (paper 0.975 s)", "actions' share (paper 47%)"], rows
    )


def tangram_fig9_dop4(name: str, cores: int = 256, batch: int = 1280) -> str:
    """Tangram's mean cores per reward and its lead over DoP 4 in one Fig. 9 cell."""
    r = result(name)
    t = r.one(experiment="fig9", policy="tangram", cpu_cores=cores, batch_size=batch)
    d4 = r.one(experiment="fig9", policy="dop4", cpu_cores=cores, batch_size=batch)
    lead = x(d4["avg_act_s"] / t["avg_act_s"])
    return (
        f"At batch {batch:,} on {cores} cores Tangram's rewards average "
        f"{t['mean_units']:.1f} cores, and it leads DoP 4 by only {lead}"
    )


def tangram_fig9(name: str) -> None:
    """Fig. 9's plot in a sentence: Tangram against DoP 16 everywhere, against DoP 4 at the
    larger batches."""
    r = result(name)
    cells = {(c["cpu_cores"], c["batch_size"]) for c in r.where(experiment="fig9")}
    smallest = min(b for _, b in cells)

    def ratio(policy: str, base: str, cores: int, b: int) -> float:
        ours = r.one(experiment="fig9", policy=policy, cpu_cores=cores, batch_size=b)
        other = r.one(experiment="fig9", policy=base, cpu_cores=cores, batch_size=b)
        return other["avg_act_s"] / ours["avg_act_s"]

    over16 = [ratio(p, "dop16", c, b) for c, b in cells for p in ("tangram", "tangram_lookahead")]
    over4 = [ratio("tangram", "dop4", c, b) for c, b in cells if b > smallest]
    para(
        f"Fig. 9: Tangram and its lookahead lead DoP 16 in {wins(over16)} cells "
        f"({span(over16, unit='x')}); over DoP 4 at the batches above {smallest} Tangram is "
        f"{span(over4, unit='x')}, where the paper has it ahead."
    )


def tangram_table1(name: str) -> None:
    """Table 1's cells: execution, queueing and overhead per action, Loom's beside the
    paper's (Loom's batches are its run's scale; the paper's are 1280/1536 and 2048/3072)."""
    rows = []
    for c in result(name).where(experiment="table1"):
        rows.append(
            [
                f"{c['workload']}, batch {c['batch_size']:,}",
                *(
                    f"{c[k]:.3f} s ({c['paper_' + k]:g} s)"
                    for k in ("exec_s", "queue_s", "overhead_s")
                ),
            ]
        )
    table(["cell", "execution (paper)", "queueing (paper)", "overhead (paper)"], rows)
