"""ROSE's figures in the docs, from stored `loom reproduce rose --json` results."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from figures.core import (
    Result,
    cite,
    claims_table,
    para,
    pct,
    result,
    run_label,
    secs,
    span,
    table,
    wins,
    x,
)

__all__ = [
    "rose_dapo",
    "rose_fig8",
    "rose_fig9",
    "rose_fig10",
    "rose_fig14",
    "rose_fig14_bound",
    "rose_fig14_longer",
    "rose_fig14_need",
    "rose_headlines",
    "rose_lease",
    "rose_served",
    "rose_serverlessllm",
    "rose_step_times",
    "rose_table2",
    "rose_table2_note",
    "rose_table3",
]

MODELS = {"qwen3-8b": "8B", "qwen3-32b": "32B"}
KEYS = {"qwen3-8b": "8b", "qwen3-32b": "32b"}
FIG7 = {"roll_grpo": "ROLL-GRPO", "roll_dapo": "ROLL-DAPO", "areal": "AReaL"}
FIG8 = {"lambda_rl": "λRL", "rlboost_plus": "RLBoost+"}
TABLE1 = {"serverlessllm": "ServerlessLLM", "prism": "Prism"}
TABLE3 = {"turn_wise": "turn-wise routing", "rose": "turn-wise + KV-cache affinity"}
FIG10 = {"async": "async", "shard": "+shard", "sparse": "+sparse"}
# Fig. 9's paragraph (§6.4): Dual-SLO "reduces P99 TPOT by 3.4% and 76.3% relative to
# TPOT-only and TTFT-only"; Fig. 8b (§6.1): preempted GPU time, as the text states it.
FIG9_PAPER = {"tpot_only": 0.034, "ttft_only": 0.763}
FIG8B_PAPER = {"lambda_rl": "up to 26.1%", "rlboost_plus": "6.8–7.3%", "rose": "<0.5%"}


def _one(r: Result, **match: Any) -> dict[str, Any] | None:
    rows = r.where(**match)
    return rows[0] if len(rows) == 1 else None


def _per_model(fn: Any, fmt: Any = x) -> Any:
    """A cell of one figure per model: "1.10x / 1.62x" (8B / 32B)."""

    def figure(r: Result) -> str | None:
        values = [fn(r, m) for m in MODELS]
        if any(v is None for v in values):
            return None
        return " / ".join(fmt(v) for v in values)

    return figure


def _paper_per_model(names: Sequence[str], fn: Any, fmt: Any = x) -> str:
    for n in names:
        values = [fn(result(n), m) for m in MODELS]
        if all(v is not None for v in values):
            return " / ".join(fmt(v) for v in values)
    return "—"


def _field(field: str, **match: Any) -> Any:
    def get(r: Result, model: str) -> float | None:
        row = _one(r, model=model, **match)
        return None if row is None or row.get(field) is None else float(row[field])

    return get


def _fig8_over_rlboost(r: Result, model: str) -> float | None:
    rose, boost = (
        _one(r, experiment="fig8", model=model, policy="rose"),
        _one(r, experiment="fig8", model=model, policy="rlboost_plus"),
    )
    return (
        None if rose is None or boost is None else boost["rollout_time_s"] / rose["rollout_time_s"]
    )


def _fig8_paper_over_rlboost(r: Result, model: str) -> float | None:
    from loom.experiments.rose import FIG8_PAPER

    key = KEYS[model]
    return FIG8_PAPER[(key, "rose")][0] / FIG8_PAPER[(key, "rlboost_plus")][0]


def _tpot_cut(base: str) -> Any:
    def get(r: Result, model: str) -> float | None:
        dual = _one(r, experiment="fig9", model=model, policy="dual_slo")
        other = _one(r, experiment="fig9", model=model, policy=base)
        return (
            None
            if dual is None or other is None
            else 1 - dual["tpot_p99_ms"] / other["tpot_p99_ms"]
        )

    return get


def _over_slo(r: Result) -> str | None:
    rows = [row for row in r.where(experiment="fig9") if row["policy"].split("@")[0] == "dual_slo"]
    if not rows:
        return None
    return " / ".join(f"{row['ttft_violations'] + row['tpot_violations']:,}" for row in rows)


def rose_headlines(names: Sequence[str]) -> None:
    """Each figure the paper states (§6 and its appendices), beside Loom's per run, 8B / 32B
    where the paper states both."""
    ratio = lambda v: f"{v:.2f}x"  # noqa: E731
    claims: list[tuple[str, str, Any]] = []
    for base, label in FIG7.items():
        match = {"experiment": "fig7", "policy": "rose", "baseline": base}
        claims.append(
            (
                f"Fig. 7: ROSE's throughput over {label}",
                _paper_per_model(names, _field("paper_speedup", **match), ratio),
                _per_model(_field("speedup", **match)),
            )
        )
    for policy, label in FIG8.items():
        match = {"experiment": "fig8", "policy": policy}
        claims.append(
            (
                f"Fig. 8a: {label}'s rollout over ROLL's",
                _paper_per_model(names, _field("paper_speedup", **match), ratio),
                _per_model(_field("speedup", **match)),
            )
        )
    claims.append(
        (
            "Fig. 8a: ROSE's rollout over RLBoost+'s",
            _paper_per_model(names, _fig8_paper_over_rlboost, ratio),
            _per_model(_fig8_over_rlboost),
        )
    )
    for policy, label in (*FIG8.items(), ("rose", "ROSE")):
        claims.append(
            (
                f"Fig. 8b: {label}'s preempted GPU time",
                FIG8B_PAPER[policy],
                _per_model(
                    _field("preempted_gpu_frac", experiment="fig8", policy=policy),
                    lambda v: pct(v, 1),
                ),
            )
        )
    for n_lent in (4, 8, 16):
        match = {"experiment": "fig14", "lent_gpus": n_lent}
        claims.append(
            (
                f"Fig. 14: 8B rollout with {n_lent} lent GPUs over none",
                _paper_field(names, "paper_speedup", ratio, **match),
                _single("speedup", x, **match),
            )
        )
    for kind, label in TABLE3.items():
        match = {"experiment": "table3", "policy": kind}
        claims.append(
            (
                f"Table 3: {label} over pinned trajectories",
                _paper_per_model(names, _field("paper_speedup", **match), ratio),
                _per_model(_field("speedup", **match)),
            )
        )
    for policy, label in TABLE1.items():
        match = {"experiment": "table1", "policy": policy}
        claims.append(
            (
                f"Table 1: {label}'s rollout time over ROSE's",
                _paper_per_model(names, _field("paper_rollout_vs_rose", **match), ratio),
                _per_model(_field("rollout_vs_rose", **match)),
            )
        )
    for base, label in (("ttft_only", "TTFT-only"), ("tpot_only", "TPOT-only")):
        claims.append(
            (
                f"Fig. 9: Dual-SLO's P99 TPOT below {label}'s",
                pct(FIG9_PAPER[base], 1),
                _per_model(_tpot_cut(base), _cut),
            )
        )
    claims.append(
        (
            "§6.2: requests over their SLO under ROSE (8B / 32B / 32B at 3x the serving)",
            "none",
            _over_slo,
        )
    )
    for variant, label in FIG10.items():
        match = {"experiment": "fig10", "policy": variant}
        claims.append(
            (
                f"Fig. 10a: weight transfer, {label} over the previous step",
                _paper_per_model(names, _field("paper_speedup_vs_prev", **match), _px),
                _per_model(_field("speedup_vs_prev", **match)),
            )
        )
    match = {"experiment": "fig10", "policy": "sparse"}
    claims.append(
        (
            "Fig. 10a: weight transfer, all four over batch",
            _paper_per_model(names, _field("paper_speedup", **match), _px),
            _per_model(_field("speedup_vs_batch", **match), lambda v: x(v, 1)),
        )
    )
    claims_table(names, claims)


def _cut(v: Any) -> str:
    """A reduction as a share, to a tenth of a point ("0.0%", never "-0.0%")."""
    text = pct(v, 1)
    return "0.0%" if text == "-0.0%" else text


def _px(v: Any) -> str:
    """A ratio as the paper states it, to one decimal: 1.6x."""
    return f"{float(v):.1f}x"


def _single(field: str, fmt: Any, **match: Any) -> Any:
    def figure(r: Result) -> str | None:
        row = _one(r, **match)
        return None if row is None else fmt(row[field])

    return figure


def _paper_field(names: Sequence[str], field: str, fmt: Any, **match: Any) -> str:
    for n in names:
        row = _one(result(n), **match)
        if row is not None and row.get(field) is not None:
            return str(fmt(row[field]))
    return "—"


def rose_fig14(names: Sequence[str]) -> None:
    """Fig. 14's 8B rollout time per number of lent GPUs, and its speedup over none, per run."""
    lent = sorted({row["lent_gpus"] for n in names for row in result(n).where(experiment="fig14")})
    rows = []
    for n_lent in lent:
        cells = []
        for n in names:
            row = result(n).one(experiment="fig14", lent_gpus=n_lent)
            cells.append(f"{row['rollout_time_s']:,.0f} s ({x(row['speedup'])})")
        rows.append([str(n_lent), *cells])
    table(["lent GPUs", *(run_label(n) for n in names)], rows)


def rose_fig14_bound(names: Sequence[str]) -> str:
    """Per run: the steps' slowest trajectory alone (seconds) and the speedup over no lent
    GPUs that ending the step with it would give: "276 s, 1.54x (seed 1)"."""
    parts = []
    for n in names:
        row = result(n).one(experiment="fig14", lent_gpus=0)
        parts.append(
            f"{row['longest_alone_s']:,.0f} s, {x(row['speedup_bound'])} (seed {result(n).seed})"
        )
    return "; ".join(parts)


def rose_fig14_need() -> str:
    """What the paper's 16-GPU speedup implies of its dedicated-only step, from its own Table 1
    and App. E figures."""
    from loom.experiments.rose import PAPER, TABLE1_PAPER

    lent = TABLE1_PAPER[("8b", "rose")][0]
    gain = PAPER[("fig14", "8b", 16)]
    return (
        f"The paper's {gain:.2f}x needs the dedicated-only step to take {gain:.2f}x the lent one "
        f"({lent * gain:,.0f} s against Table 1's {lent:,.0f} s)"
    )


def rose_dapo(name: str, model: str = "qwen3-32b") -> str:
    """ROSE's DAPO step against ROLL's, and its throughput against ROLL's."""
    r = result(name)
    rose = r.one(experiment="fig7", model=model, policy="rose", baseline="roll_dapo")
    roll = r.one(experiment="fig7", model=model, policy="roll_dapo")
    return (
        f"its step is {x(roll['step_time_s'] / rose['step_time_s'])} shorter than ROLL's but its "
        f"tokens/s only {x(rose['speedup'])} higher"
    )


def rose_fig8(names: Sequence[str]) -> None:
    """Fig. 8: how often the elastic baselines gain more over ROLL than the paper's, how much of
    the spot trace a run's steps cover, and the GPU time they lose to preemption."""
    rows = [row for n in names for row in result(n).where(experiment="fig8")]
    elastic = [row for row in rows if row["policy"] in FIG8]

    def above(model: str) -> str:
        cells = [row["speedup"] / row["paper_speedup"] for row in elastic if row["model"] == model]
        return wins(cells)

    roll = result(names[0]).one(experiment="fig8", model="qwen3-32b", policy="roll")
    minutes = roll["steps"] * roll["step_time_s"] / 60

    def lost(policy: str) -> str:
        return span(
            [100 * row["preempted_gpu_frac"] for row in rows if row["policy"] == policy],
            lambda v: f"{v:.1f}",
            unit="%",
        )

    para(
        f"*Fig. 8*: the elastic baselines gain more over ROLL than the paper's in "
        f"{above('qwen3-32b')} (system, run) cells on 32B and {above('qwen3-8b')} on 8B: "
        f"{roll['steps']} steps cover the first {minutes:.0f} minutes of the spot window (32B, "
        f"seed {result(names[0]).seed}), when most spot GPUs are up. Recovery times come from "
        f"outside sources (82–180 s, `rose.toml`), not from the paper's overheads, and λRL "
        f"loses only the turns in flight at each 15-minute expiry: λRL loses {lost('lambda_rl')} "
        f"of its GPU time to preemption (paper up to 26.1%), RLBoost+ {lost('rlboost_plus')} "
        f"(paper 6.8–7.3%)."
    )


def rose_lease(name: str) -> str:
    """Table 4 in a clause: the rollout time and P99 TTFT over the leases (8B)."""
    rows = result(name).where(experiment="table4")
    rollout = span([row["rollout_time_s"] for row in rows], lambda v: f"{v:,.0f}", unit=" s")
    ttft = span([row["ttft_p99_ms"] for row in rows], lambda v: f"{v:,.0f}", unit=" ms")
    leases = ", ".join(f"{row['lease_s']:g}" for row in rows)
    return f"rollout {rollout} and P99 TTFT {ttft} under leases of {leases} s"


def rose_fig14_longer(names: Sequence[str]) -> str:
    """Where more lent GPUs made the 8B rollout longer: "seed 7, 4 → 8 (378 → 380 s)"."""
    found = []
    for n in names:
        rows = sorted(result(n).where(experiment="fig14"), key=lambda row: row["lent_gpus"])
        for a, b in pairwise(rows):
            if b["rollout_time_s"] > a["rollout_time_s"]:
                found.append(
                    f"seed {result(n).seed}, {a['lent_gpus']} → {b['lent_gpus']} lent GPUs "
                    f"({a['rollout_time_s']:,.0f} → {b['rollout_time_s']:,.0f} s)"
                )
    return "; ".join(found) or "in none of these runs"


def rose_table3(names: Sequence[str]) -> str:
    """How often either routing beats pinning, over the models and runs."""
    rows = [
        row for n in names for row in result(n).where(experiment="table3") if row["policy"] != "pin"
    ]
    return wins([row["speedup"] for row in rows])


FIG9_POLICIES = {
    "dual_slo": "Dual-SLO",
    "ttft_only": "TTFT-only",
    "tpot_only": "TPOT-only",
    "none": "no admission",
}


def rose_fig9(name: str) -> None:
    """Fig. 9 per model and policy (and at three times the serving density): P99 TTFT and
    TPOT, requests over their SLO, and the step time."""
    rows = []
    for row in result(name).where(experiment="fig9"):
        policy, _, density = row["policy"].partition("@x")
        rows.append(
            [
                f"{MODELS[row['model']]}{f' at {density}x' if density else ''}",
                FIG9_POLICIES[policy],
                f"{row['ttft_p99_ms']:,.0f} ms",
                f"{row['tpot_p99_ms']:,.0f} ms",
                f"{row['ttft_violations'] + row['tpot_violations']:,}",
                f"{row['step_time_s']:,.0f} s",
            ]
        )
    table(["model", "admission", "P99 TTFT", "P99 TPOT", "over SLO", "step"], rows)


def rose_step_times(name: str) -> str:
    """TTFT-only's step time over Dual-SLO's, per model."""
    r = result(name)
    ratios = [
        r.value("step_time_s", experiment="fig9", model=m, policy="ttft_only")
        / r.value("step_time_s", experiment="fig9", model=m, policy="dual_slo")
        for m in MODELS
    ]
    return " and ".join(f"{x(v)} on {MODELS[m]}" for v, m in zip(ratios, MODELS, strict=True))


def rose_table2_note(name: str) -> None:
    """Table 2 in a sentence: the paper's TPOT drop against Loom's, where memory preemption
    fires, and what prefix caching gains."""
    from loom.experiments.rose import COSERVE_PAPER

    r = result(name)

    def row(model: str, variant: str) -> dict[str, Any]:
        return r.one(experiment="table2", model=model, policy=variant)

    paper_drop = [
        COSERVE_PAPER[("table2", k, "static_partition")][2]
        / COSERVE_PAPER[("table2", k, "+memory_preemption")][2]
        for k in KEYS.values()
    ]
    ours_drop = [
        row(m, "static_partition")["tpot_p99_ms"] / row(m, "+memory_preemption")["tpot_p99_ms"]
        for m in MODELS
    ]
    idle = [
        MODELS[m]
        for m in MODELS
        if row(m, "static_partition")["rollout_time_s"]
        == row(m, "+memory_preemption")["rollout_time_s"]
    ]
    cache = [
        row(m, "+memory_preemption")["rollout_time_s"] / row(m, "+prefix_caching")["rollout_time_s"]
        for m in MODELS
    ]
    paper_cache = [
        COSERVE_PAPER[("table2", k, "+memory_preemption")][0]
        / COSERVE_PAPER[("table2", k, "+prefix_caching")][0]
        for k in KEYS.values()
    ]
    para(
        f"The {span(paper_drop, lambda v: f'{v:.0f}')}x TPOT drop the paper measures from the "
        f"static partition to memory preemption does not appear "
        f"({span(ours_drop, unit='x')} here); memory preemption never fires on "
        f"{' and '.join(idle) or 'neither model'} (the two runs are identical). Prefix caching "
        f"then shortens the rollout {' / '.join(x(v) for v in cache)} (paper "
        f"{' / '.join(x(v) for v in paper_cache)})."
    )


def rose_table2(name: str) -> None:
    """Table 2 per model and variant: rollout time and P99 TPOT, the paper's beside them."""
    rows = []
    for row in result(name).where(experiment="table2"):
        rows.append(
            [
                MODELS[row["model"]],
                f"`{row['policy']}`",
                f"{row['rollout_time_s']:,.0f} s ({row['paper_rollout_time_s']:,.0f} s)",
                f"{row['tpot_p99_ms']:,.0f} ms ({row['paper_tpot_p99_ms']:,.0f} ms)",
            ]
        )
    table(["model", "variant", "rollout (paper)", "P99 TPOT (paper)"], rows)


def rose_serverlessllm(name: str) -> None:
    """ServerlessLLM in Table 1: its rollout against Fig. 14's none lent, and what scaling to
    zero at once does to serving."""
    r = result(name)
    swap = [r.one(experiment="table1", model=m, policy="serverlessllm") for m in MODELS]
    zero = [r.one(experiment="table1", model=m, policy="serverlessllm@keepalive0") for m in MODELS]
    none_lent = r.one(experiment="fig14", lent_gpus=0)["rollout_time_s"]
    over = sum(row["ttft_violations"] + row["tpot_violations"] for row in swap)

    def each(rows: list[dict[str, Any]], field: str, scale: float = 1.0, digits: int = 0) -> str:
        return " / ".join(f"{row[field] * scale:,.{digits}f}" for row in rows)

    para(
        f"ServerlessLLM sends {over:,} requests over their SLO (paper: TTFT P99 "
        f"{each(swap, 'paper_p99_ms')} ms), and its 8B rollout takes "
        f"{swap[0]['rollout_time_s']:,.0f} s, as long as with no lent GPUs at all "
        f"({none_lent:,.0f} s): at Fig. 3b's load a prefiller's serving gaps are far shorter than "
        f"the 1.2–5 s a reload takes, so the rollout model almost never comes in and the lent "
        f"GPUs serve alone. Scaled down the moment serving idles, it loads the rollout model in "
        f"nearly every gap and every arrival then waits for a reload: TTFT P99 "
        f"{each(zero, 'ttft_p99_ms', 1e-3, 1)} s, {each(zero, 'ttft_over_slo', 100)}% of "
        f"requests over the SLO, and still no faster rollout ({each(zero, 'rollout_time_s')} s "
        f"against {each(swap, 'rollout_time_s')} s)."
    )


def rose_fig10(name: str) -> None:
    """Fig. 10's 32B miss and the stream rate behind it."""
    r = result(name)
    batch = r.one(experiment="fig10", model="qwen3-32b", policy="batch")
    shard = r.one(experiment="fig10", model="qwen3-32b", policy="shard")
    sparse = r.one(experiment="fig10", model="qwen3-32b", policy="sparse")
    para(
        f"*Fig. 10*: the 32B shard step is {x(shard['speedup_vs_prev'])} (paper "
        f"{_px(shard['paper_speedup_vs_prev'])}), {x(sparse['speedup_vs_batch'], 1)} in total "
        f"(paper {_px(sparse['paper_speedup'])}): the one constant fitted to App. F (0.3 s per "
        f"64 MiB push, measured with 16 pushers) leaves a single batch/async stream at "
        f"{batch['bytes_sent'] / batch['push_s'] / 1e6:,.0f} MB/s, which makes the unsharded 32B "
        f"baselines slow ({batch['transfer_s']:,.0f} s for batch); see "
        f"`loom.experiments.rose_transfer`'s docstring."
    )


def _att(a: Any, b: Any) -> str:
    """TTFT / TPOT shares within the SLO ("–" where no serving ran)."""
    if a is None or b is None:
        return "–"
    return f"{pct(a, 1)} / {pct(b, 1)}"


def rose_served(name: str) -> None:
    """ROSE served on emulated GPUs (`bench_rose_served.py`): per number of lent GPUs, the
    rollout time served and simulated, the speedup over none, the turns moved off lent
    engines, and serving's SLO attainment beside it, alone and simulated."""
    r = result(name)
    rows = sorted(r.where(record="served"), key=lambda row: row["lent_gpus"])
    base = next(row for row in rows if row["lent_gpus"] == 0)
    table(
        [
            "lent GPUs",
            "rollout (served)",
            "simulated",
            "served / simulated",
            "speedup over none (served / simulated)",
            "turns moved off lent",
            "serving requests",
            "TTFT / TPOT within SLO",
            "serving alone",
            "simulated ",
        ],
        [
            [
                str(row["lent_gpus"]),
                secs(row["rollout_s"]),
                secs(row["sim_rollout_s"]),
                x(row["served_over_simulated"]),
                f"{x(base['rollout_s'] / row['rollout_s'])} / "
                f"{x(base['sim_rollout_s'] / row['sim_rollout_s'])}",
                str(row["moved"]),
                f"{row['serving_ended']:,}",
                _att(row["ttft_attainment"], row["tpot_attainment"]),
                _att(row.get("alone_ttft_attainment"), row.get("alone_tpot_attainment")),
                _att(row["sim_ttft_attainment"], row["sim_tpot_attainment"]),
            ]
            for row in rows
        ],
    )
    para(f"Measured: {cite(name)}.")
