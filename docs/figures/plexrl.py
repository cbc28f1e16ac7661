"""PlexRL's figures in the docs, from stored `loom reproduce plexrl --json` results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from figures.core import (
    Result,
    bullet,
    claims_table,
    f1,
    para,
    pct,
    result,
    run_label,
    span,
    table,
    wins,
    x,
)

__all__ = [
    "plexrl_backfill_at",
    "plexrl_colocated",
    "plexrl_fig7b",
    "plexrl_fig7b_caption",
    "plexrl_fig7c",
    "plexrl_fig8",
    "plexrl_fig8_delays",
    "plexrl_fig8_drain",
    "plexrl_headlines",
    "plexrl_pack_spread",
    "plexrl_switches",
    "plexrl_table2",
    "plexrl_train_share",
]

MODELS = {"qwen2.5-7b": "7B", "qwen3-30b-a3b": "30B", "qwen3-235b-a22b": "235B"}
SHARING = {"pack": "Pack", "spread": "Spread", "spread_backfill": "Spread+Backfill"}
FULL = "300 jobs"  # a full run's label: Fig. 8's trace


def _row(r: Result, **match: Any) -> dict[str, Any] | None:
    rows = r.where(**match)
    return rows[0] if len(rows) == 1 else None


def _claim(
    names: Sequence[str], label: str, ours: str, paper_field: str, fmt: Any, **match: Any
) -> Any:
    """A headline row: the paper's figure (as the experiment's records hold it, to the
    paper's two decimals) and Loom's in each run."""
    paper = next(row[paper_field] for n in names if (row := _row(result(n), **match)))
    pfmt = (lambda v: pct(v, 2)) if fmt is not _ratio else fmt

    def figure(r: Result) -> str | None:
        row = _row(r, **match)
        return None if row is None else fmt(row[ours])

    return (label, pfmt(paper), figure)


def _ratio(v: Any) -> str:
    return f"{float(v):.2f}x"


def _pspan(values: Sequence[Any]) -> str:
    """A range of shares: 71–81%."""
    return span([100 * float(v) for v in values], lambda v: f"{v:.0f}", unit="%")


def _share(v: Any) -> str:
    return pct(v, 1)


def plexrl_headlines(names: Sequence[str]) -> None:
    """Each figure the paper states (Table 2, §6.2, §6.3), beside Loom's in each run."""
    claims = []
    for m, label in MODELS.items():
        claims.append(
            _claim(
                names,
                f"Table 2, {label}: training pool's bubble ratio",
                "bubble_ratio",
                "paper_bubble_ratio",
                lambda v: pct(v, 2),
                experiment="table2",
                model=m,
            )
        )
    for m, label in MODELS.items():
        claims.append(
            _claim(
                names,
                f"Fig. 7b, {label}: GPU-hours saved over Split-Async",
                "saving_vs_split_async",
                "paper_saving_vs_split_async",
                _share,
                experiment="fig7b",
                model=m,
                policy="plexrl",
            )
        )
    for policy, label in (("plexrl", "PlexRL's rollout DP"), ("colocated", "the colocated DP")):
        claims.append(
            _claim(
                names,
                f"Fig. 7c, 235B: real over saturated throughput at {label}",
                "throughput_auc_ratio",
                "paper_throughput_auc_ratio",
                _share,
                experiment="fig7c",
                model="qwen3-235b-a22b",
                policy=policy,
            )
        )
    claims.append(
        _claim(
            names,
            "Fig. 8: Spread+Backfill's time to drain over Isolated's",
            "drain_vs_isolated",
            "paper_drain_vs_isolated",
            _ratio,
            experiment="fig8",
            policy="spread_backfill",
        )
    )
    claims_table(names, claims, full=FULL)


def plexrl_table2(name: str) -> str:
    """Table 2's bubble ratios and how far the farthest is from the paper's, in points."""
    rows = result(name).where(experiment="table2")
    ratios = "/".join(pct(row["bubble_ratio"], 2) for row in rows)
    worst = max(abs(row["diff_pp"]) for row in rows)
    return f"{ratios}, within {worst:.3f} points of the paper's"


def plexrl_fig7b(name: str) -> None:
    """Why PlexRL's saving is the GPU count's: the pool's idle share, the switches' share and
    the training operations' length, and a cycle as long shared as alone."""
    r = result(name)
    table2 = r.where(experiment="table2")
    plex = r.where(experiment="fig7b", policy="plexrl")
    alone = {row["model"]: row for row in r.where(experiment="fig7b", policy="split_async")}
    same = sum(abs(row["step_time_s"] - alone[row["model"]]["step_time_s"]) < 1e-6 for row in plex)
    over = [
        row for row in plex if row["saving_vs_split_async"] > row["paper_saving_vs_split_async"]
    ]
    longer = [
        (1 - row["paper_saving_vs_split_async"]) / (1 - row["saving_vs_split_async"]) - 1
        for row in over
    ]
    slower = [MODELS[row["model"]] for row in over]
    para(
        f"*Fig. 7b* (seed {r.seed}): two jobs share a training pool that one job leaves "
        f"{_pspan([row['bubble_ratio'] for row in table2])} idle; state switches take "
        f"{span([100 * row['setup_share'] for row in plex], f1, unit='%')} of the shared "
        f"pool's time, and a job's training operations "
        f"({span([row['train_s'] for row in table2], lambda v: f'{v:.0f}')} s a cycle) fit in "
        f"the other's bubble. So in this model sharing never slows a cycle (a shared cycle is as "
        f"long as a lone one for {same} of {len(plex)} jobs) and the saving is the GPU count's: "
        f"(2·R + T)/2 against R + T. The paper's extra cost on {' and '.join(slower)} — "
        f"{' and '.join(pct(v) for v in longer)} longer cycles, by that arithmetic — is not "
        f"explained in it; interference beyond the operations' own times (host memory, "
        f"network, stragglers) is not modelled."
    )


def plexrl_fig7b_caption(name: str) -> None:
    """Fig. 7b's plot in a sentence: for which jobs PlexRL's saving is within 10% of the
    paper's, and by how many points it is above it elsewhere."""
    rows = result(name).where(experiment="fig7b", policy="plexrl")
    near = [MODELS[r["model"]] for r in rows if _within(r)]
    far = [r for r in rows if not _within(r)]
    gaps = [100 * (r["saving_vs_split_async"] - r["paper_saving_vs_split_async"]) for r in far]
    para(
        f"Fig. 7b: PlexRL's saving over Split-Async is within 10% of the paper's for "
        f"{' and '.join(near) or 'no job'}"
        + (
            f" and {span([abs(g) for g in gaps], lambda v: f'{v:.0f}')} points "
            f"{'above' if all(g > 0 for g in gaps) else 'off'} it for "
            f"{' and '.join(MODELS[r['model']] for r in far)} (the last section says why)."
            if far
            else "."
        )
    )


def _within(row: dict[str, Any]) -> bool:
    return abs(row["saving_vs_split_async"] / row["paper_saving_vs_split_async"] - 1) <= 0.10


def plexrl_colocated(name: str) -> None:
    """Colocated per job: its saving over Split-Async, how much faster its rollout runs spread
    over the training GPUs, and its two mode switches a step."""
    r = result(name)
    rows = []
    for m, label in MODELS.items():
        col = r.one(experiment="fig7b", model=m, policy="colocated")
        alone = r.one(experiment="table2", model=m)
        plex = r.one(experiment="fig7b", model=m, policy="plexrl")
        rows.append(
            [
                label,
                pct(plex["saving_vs_split_async"]),
                pct(col["saving_vs_split_async"]),
                x(alone["cycle_s"] / col["rollout_time_s"], 1),
                f"{col['switch_s']:.1f} s",
            ]
        )
    table(
        ["job", "PlexRL saves", "Colocated saves", "rollout faster spread", "switches a step"],
        rows,
    )


def plexrl_fig7c(name: str) -> None:
    """Fig. 7c's 235B figures against the paper's: the order, and how far the levels are."""
    r = result(name)
    plex = r.one(experiment="fig7c", model="qwen3-235b-a22b", policy="plexrl")
    col = r.one(experiment="fig7c", model="qwen3-235b-a22b", policy="colocated")
    order = "holds" if plex["throughput_auc_ratio"] > col["throughput_auc_ratio"] else "flips"
    para(
        f"*Fig. 7c*: the 235B rollout runs at {pct(plex['throughput_auc_ratio'], 1)} of saturated "
        f"throughput at DP {plex['replicas']} and {pct(col['throughput_auc_ratio'], 1)} at the "
        f"colocated DP {col['replicas']} (paper {pct(plex['paper_throughput_auc_ratio'], 1)} and "
        f"{pct(col['paper_throughput_auc_ratio'], 1)}): the order {order}, the levels are "
        f"{pct(plex['throughput_auc_ratio'] / plex['paper_throughput_auc_ratio'])} and "
        f"{pct(col['throughput_auc_ratio'] / col['paper_throughput_auc_ratio'])} of the paper's."
    )


def _drain(r: Result, exp: str, load: float | None = None) -> dict[str, float]:
    rows = r.where(experiment=exp) if load is None else r.where(experiment=exp, load=load)
    return {row["policy"]: row["drain_vs_isolated"] for row in rows}


def plexrl_fig8(names: Sequence[str]) -> None:
    """Fig. 8's time to drain the trace over Isolated's, per run and offered load (`fig8` at
    the run's load, `fig8_load` at 1, 2 and 3)."""
    rows = []
    for n in names:
        r = result(n)
        loads = sorted({row["load"] for row in r.where(experiment="fig8_load")})
        fig8_load = r.where(experiment="fig8")[0]["load"]
        for load in sorted({*loads, fig8_load}):
            d = _drain(r, "fig8" if load == fig8_load else "fig8_load", load)
            rows.append([run_label(n, FULL), f"{load:g}", *(f"{d[p]:.2f}x" for p in SHARING)])
    table(["run", "offered load", *SHARING.values()], rows)


def _pairs(names: Sequence[str]) -> list[dict[str, float]]:
    out = []
    for n in names:
        r = result(n)
        out.append(_drain(r, "fig8"))
        for load in sorted({row["load"] for row in r.where(experiment="fig8_load")}):
            out.append(_drain(r, "fig8_load", load))
    return out


def plexrl_pack_spread(names: Sequence[str]) -> str:
    """How often Pack drains sooner than Spread over every run and load, and the widest gap."""
    pairs = _pairs(names)
    gap = max(abs(d["pack"] / d["spread"] - 1) for d in pairs)
    return (
        f"Pack drains sooner than Spread in {wins([d['spread'] / d['pack'] for d in pairs])} "
        f"(run, load) cells above, and the two are within {pct(gap, 1)} of each other"
    )


def plexrl_backfill_at(names: Sequence[str], load: float) -> str:
    """Spread+Backfill's drain time over Isolated's at one offered load, over the runs."""
    values = [
        result(n).value(
            "drain_vs_isolated", experiment="fig8_load", load=load, policy="spread_backfill"
        )
        for n in names
    ]
    return span(values, unit="×")


def plexrl_fig8_delays(names: Sequence[str]) -> None:
    """Normalised queueing delay at P50/P90/P99 of Isolated and Spread+Backfill, per run, and
    in how many runs Spread+Backfill's is the lowest at every percentile."""
    rows, lowest = [], 0
    keys = ("queue_delay_p50", "queue_delay_p90", "queue_delay_p99")
    for n in names:
        r = result(n)
        by = {row["policy"]: row for row in r.where(experiment="fig8")}
        lowest += all(by["spread_backfill"][k] == min(b[k] for b in by.values()) for k in keys)
        rows.append([run_label(n, FULL), *("/".join(f"{by[p][k]:.2f}" for k in keys) for p in by)])
    table(["run", *(f"{SHARING.get(p, 'Isolated')} P50/P90/P99" for p in by)], rows)
    para(
        f"Spread+Backfill's delays are the lowest at every percentile in {lowest} of "
        f"{len(names)} runs."
    )


def plexrl_fig8_drain(name: str) -> str:
    """Fig. 8's plot in a clause: Spread+Backfill's drain time beside the paper's."""
    r = result(name)
    d = _drain(r, "fig8")
    row = r.one(experiment="fig8", policy="spread_backfill")
    best = min((v, p) for p, v in d.items())[1]
    sooner = sum(v < 1 for p, v in d.items() if p != "isolated")
    return (
        f"{sooner} of {len(d) - 1} sharing policies drain sooner than Isolated; "
        f"{SHARING.get(best, best)} does best, at {d['spread_backfill']:.2f}× Isolated's time "
        f"against the paper's {row['paper_drain_vs_isolated']:.2f}×"
    )


def plexrl_switches() -> None:
    """The modelling-choices item on switches: the measured bandwidths the model is given and
    what a load takes at them, from the code's own data (`src/loom/sim/workloads/data/
    plexrl.toml`, where each bandwidth names the command that measured it)."""
    from loom.sim.workloads.plexrl import plexrl_jobs, state_costs

    c = state_costs()
    loads = [c.load_s(job) for job in plexrl_jobs()]
    bullet(
        f"**Switches** (Eq. 3's C_setup): offload the resident job's state and load the next "
        f"one's at the pinned host↔GPU bandwidth measured on an H200 "
        f"(`python benchmarks/bench_host_device_copy.py`: {c.pinned_h2d_gbs:.0f} GB/s each way; "
        f"pageable: {c.pageable_h2d_gbs:g} GB/s in, {c.pageable_d2h_gbs:g} GB/s out). A rank "
        f"holds bf16 weights (split by PP, experts by EP) and, but for the 235B job's "
        f"ZeRO-offload, its shard of the fp32 optimizer: {span(loads, lambda v: f'{v:.2f}')} s "
        f"a load."
    )


def plexrl_train_share(name: str) -> str:
    """The share of a cycle Table 2's training operations take (one minus the bubble)."""
    return _pspan([1 - row["bubble_ratio"] for row in result(name).where(experiment="table2")])
