"""Heddle's figures in the docs, from stored `loom reproduce heddle --json` results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from figures.core import StoredResultError, result, span, table, x

__all__ = [
    "fig14_counters",
    "fig14_record",
    "fig15_counters",
    "heddle_fig14",
    "heddle_fig15",
    "heddle_headlines",
    "heddle_run",
    "heddle_summary",
    "placement_wins",
    "pps_wins",
]

WORKLOADS = ("coding", "search", "math")


def heddle_run(name: str) -> str:
    """A run's label: its scale and seed."""
    doc = result(name).doc
    scale = "`--quick`" if doc["quick"] else "64 GPUs"
    return f"{scale}, seed {doc['seed']}"


def heddle_summary(name: str, ablation: str | None, policy: str, workload: str) -> dict[str, Any]:
    """A run's summary row: Fig. 12's (ablation None, Qwen3-14B) or an ablation's."""
    rows = [
        r
        for r in result(name).where(experiment="summary", policy=policy, workload=workload)
        if r.get("ablation") == ablation and (ablation or r["model"] == "qwen3-14b")
    ]
    if len(rows) != 1:
        raise StoredResultError(f"{name}: {len(rows)} summary rows for {ablation} {policy}")
    return rows[0]


def _paper(experiment: str, baseline: str) -> str:
    from loom.experiments.heddle import SPEEDUP_PAPER

    lo, hi = SPEEDUP_PAPER[experiment][baseline]
    return f"{lo:.2f}–{hi:.2f}x"


def heddle_headlines(names: Sequence[str]) -> None:
    """Each speedup the paper states, beside Loom's range over the workloads (and, for Fig.
    12, the three models) of each run."""
    rows: list[list[str]] = []
    claims = [
        ("fig12", None, "heddle", "Fig. 12: Heddle over {b}", ("verl", "verl_star", "slime")),
        ("fig14", "fig14", "pps", "Fig. 14: PPS over {b}", ("fcfs", "rr", "sjf")),
        ("fig15", "fig15", "heddle", "Fig. 15: placement over {b}", ("least_load", "cache_aware")),
    ]
    for exp, ablation, policy, label, baselines in claims:
        for b in baselines:
            cells = []
            for name in names:
                values = [
                    r[f"vs_{b}"]
                    for r in result(name).where(experiment="summary", policy=policy)
                    if r.get("ablation") == ablation
                ]
                cells.append(span(values, lambda v: f"{v:.2f}", unit="x"))
            rows.append([label.format(b=f"`{b}`"), _paper(exp, b), *cells])
    table(["the paper's claim", "paper", *(heddle_run(n) for n in names)], rows)


def _fastest_other(r: dict[str, Any]) -> str:
    others = {k.removeprefix("vs_"): v for k, v in r.items() if k.startswith("vs_")}
    best = min(others, key=lambda k: others[k])  # the smallest ratio: the fastest other
    return f"{x(others[best])} ({best})"


def heddle_fig14(names: Sequence[str]) -> None:
    """PPS over the fastest other scheduler, per workload and run."""
    table(
        ["workload", *(heddle_run(n) for n in names)],
        [
            [w, *(_fastest_other(heddle_summary(n, "fig14", "pps", w)) for n in names)]
            for w in WORKLOADS
        ],
    )


def heddle_fig15(names: Sequence[str], policy: str = "heddle") -> None:
    """Heddle's placement over least-load and cache-aware, per workload and run."""
    table(
        ["workload", *(heddle_run(n) for n in names)],
        [
            [
                w,
                *(
                    f"{x(s['vs_least_load'])} / {x(s['vs_cache_aware'])}"
                    for s in (heddle_summary(n, "fig15", policy, w) for n in names)
                ),
            ]
            for w in WORKLOADS
        ],
    )


def fig14_record(name: str, workload: str, policy: str) -> dict[str, Any]:
    return result(name).one(experiment="fig14", workload=workload, policy=policy)


def pps_wins(names: Sequence[str]) -> tuple[int, int]:
    """Runs (workload x run) where PPS beats every other scheduler, and all runs."""
    ratios = [
        min(v for k, v in heddle_summary(n, "fig14", "pps", w).items() if k.startswith("vs_"))
        for n in names
        for w in WORKLOADS
    ]
    return sum(r > 1 for r in ratios), len(ratios)


def placement_wins(names: Sequence[str], over: str = "least_load") -> tuple[int, int]:
    ratios = [
        heddle_summary(n, "fig15", "heddle", w)[f"vs_{over}"] for n in names for w in WORKLOADS
    ]
    return sum(r > 1 for r in ratios), len(ratios)


def fig14_counters(name: str, workload: str, policies: Sequence[str]) -> None:
    """What each scheduler did in one run: makespan, preemptions, tokens prefilled, the mean
    number of trajectories alive and the longest queueing delay."""
    rows = []
    for p in policies:
        r = fig14_record(name, workload, p)
        rows.append(
            [
                f"`{p}`",
                f"{r['rollout_time_s']:,.0f} s",
                f"{r['preemptions']:,}",
                f"{r['prefill_tokens'] / 1e6:.2f}M",
                f"{r['mean_active_trajectories']:,.0f}",
                f"{r['longest_queue_delay_s']:,.2f} s",
            ]
        )
    table(
        ["scheduler", "rollout time", "preemptions", "prefilled", "alive (mean)", "longest queue"],
        rows,
    )


def fig15_counters(name: str, workload: str, policies: Sequence[str]) -> None:
    """What each placement did in one run."""
    rows = []
    for p in policies:
        r = result(name).one(experiment="fig15", workload=workload, policy=p)
        rows.append(
            [
                f"`{p}`",
                f"{r['rollout_time_s']:,.0f} s",
                f"{r['preemptions']:,}",
                f"{r['migrations']:,}",
                f"{r['prefill_tokens'] / 1e6:.2f}M",
            ]
        )
    table(["placement", "rollout time", "preemptions", "migrations", "prefilled"], rows)
