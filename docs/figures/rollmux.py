"""RollMux's figures in the docs, from stored `loom reproduce rollmux --json` results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from figures.core import Result, claims_table, para, pct, result, span, table, wins, x

__all__ = [
    "rollmux_baselines",
    "rollmux_fig10",
    "rollmux_fig14b",
    "rollmux_fig15",
    "rollmux_headlines",
    "rollmux_table4",
]

BENCHMARKS = ("temporal", "train", "spatial")
BASELINES = {"solo_d": "Solo-D", "gavel_plus": "Gavel+", "verl": "veRL"}
SWEEPS = ("fig14a", "fig14b", "fig14c")
# §7.5 (Fig. 14a): RollMux's cost is "1.01x-1.12x relative to the optimal" with 100% SLO
# attainment; Random's "1.72x-2.00x optimal", Greedy's "1.38x-1.89x".
FIG14A_PAPER = {"rollmux": "1.01–1.12x", "random": "1.72–2.00x", "greedy": "1.38–1.89x"}
FULL = "300 jobs"  # a full run's label: the trace's size


def _first(r: Result, **match: Any) -> dict[str, Any] | None:
    rows = r.where(**match)
    return rows[0] if rows else None


def _field(field: str, fmt: Any = x, **match: Any) -> Any:
    def figure(r: Result) -> str | None:
        row = _first(r, **match)
        return None if row is None else fmt(row[field])

    return figure


def _xspan(values: Sequence[Any]) -> str:
    return span(values, unit="x")


def _pspan(values: Sequence[Any]) -> str:
    """A range of shares: 45–92%."""
    return span([100 * float(v) for v in values], lambda v: f"{v:.0f}", unit="%")


def _sweep_span(policy: str, field: str, fmt: Any) -> Any:
    def figure(r: Result) -> str | None:
        values = [row[field] for e in SWEEPS for row in r.where(experiment=e, policy=policy)]
        return fmt(values) if values else None

    return figure


def _paper(names: Sequence[str], field: str, fmt: Any = x, **match: Any) -> str:
    for n in names:
        row = _first(result(n), **match)
        if row is not None and row.get(field) is not None:
            return str(fmt(row[field]))
    return "—"


def rollmux_headlines(names: Sequence[str]) -> None:
    """Each figure the paper states in its text and tables (§7.2-7.5), beside Loom's."""
    claims: list[tuple[str, str, Any]] = []
    for bench in BENCHMARKS:
        for base, label in BASELINES.items():
            match = {"experiment": "fig10", "benchmark": bench, "policy": base}
            claims.append(
                (
                    f"Fig. 10, {bench}: cost efficiency over {label}",
                    _paper(names, "paper_rollmux_gain_x", lambda v: f"{v:g}x", **match),
                    _field("rollmux_gain_x", **match),
                )
            )
    for bench in BENCHMARKS:
        for policy, label in (("ideal", "Ideal"), ("rollmux", "RollMux")):
            match = {"experiment": "table4", "benchmark": bench, "policy": policy}
            claims.append(
                (
                    f"Table 4, {bench}: {label}'s training throughput over Solo-D's",
                    _paper(names, "paper_normalized_throughput", _f2, **match),
                    _field("normalized_throughput", _f2, **match),
                )
            )
    claims += [
        (
            "Fig. 14: RollMux's cost over the optimum, every setting",
            FIG14A_PAPER["rollmux"],
            _sweep_span("rollmux", "cost_vs_opt", _xspan),
        ),
        (
            "Fig. 14: RollMux's SLO attainment, every setting",
            "100%",
            _sweep_span("rollmux", "slo_attainment", _pspan),
        ),
    ]
    for policy, label in (("random", "Random"), ("greedy", "Greedy")):
        claims.append(
            (
                f"Fig. 14a: {label}'s cost over the optimum",
                FIG14A_PAPER[policy],
                lambda r, policy=policy: _xspan(
                    [row["cost_vs_opt"] for row in r.where(experiment="fig14a", policy=policy)]
                ),
            )
        )
    for policy, label in (("rollmux", "RollMux"), ("random", "Random"), ("greedy", "Greedy")):
        match = {"experiment": "fig15", "policy": policy}
        claims += [
            (
                f"Fig. 15: {label}'s cost over the optimum",
                _paper(names, "paper_cost_vs_opt", **match),
                _field("cost_vs_opt", **match),
            ),
            (
                f"Fig. 15: {label}'s SLO attainment",
                _paper(names, "paper_slo_attainment", pct, **match),
                _field("slo_attainment", pct, **match),
            ),
        ]
    for field, label in (("solo_d_cost_over_this_x", "Solo-D"), ("verl_cost_over_this_x", "veRL")):
        match = {"experiment": "testbed", "policy": "rollmux"}
        claims.append(
            (
                f"§7.4, production trace: cost efficiency over {label}",
                _paper(names, f"paper_{field}", **match),
                _field(field, **match),
            )
        )
    claims_table(names, claims, full=FULL)


def _f2(v: Any) -> str:
    return f"{float(v):.2f}"


def rollmux_fig14b(names: Sequence[str], slo: str = "2.0") -> None:
    """A sentence: RollMux's cost over the optimum at one uniform SLO, per run, beside its
    range over every other Fig. 14 setting."""
    at, others, slo_met = [], [], []
    for n in names:
        r = result(n)
        at.append(
            f"{x(r.value('cost_vs_opt', experiment='fig14b', policy='rollmux', slo=slo))} "
            f"({_label(r)})"
        )
        for e in SWEEPS:
            for row in r.where(experiment=e, policy="rollmux"):
                slo_met.append(row["slo_attainment"])
                if not (e == "fig14b" and row["slo"] == slo):
                    others.append(row["cost_vs_opt"])
    para(
        f"**Fig. 14b at SLO {slo}**: RollMux costs {' and '.join(at)} the optimum's (paper: "
        f"{FIG14A_PAPER['rollmux']} across Fig. 14); every other setting is "
        f"{span(others, unit='x')}, and SLO attainment is {_pspan(slo_met)} throughout."
    )


def _label(r: Result) -> str:
    doc = r.doc
    return f"{'`--quick`' if doc.get('quick') else FULL}, seed {doc.get('seed')}"


def rollmux_baselines(names: Sequence[str]) -> None:
    """A sentence: Random's and Greedy's cost and SLO attainment over every setting of Fig. 14
    and 15, and how often Greedy costs less than the optimum."""
    rows = {
        p: [
            row
            for n in names
            for e in (*SWEEPS, "fig15")
            for row in result(n).where(experiment=e, policy=p)
        ]
        for p in ("random", "greedy")
    }
    cost = {p: span([row["cost_vs_opt"] for row in rs], unit="x") for p, rs in rows.items()}
    slo = _pspan([row["slo_attainment"] for rs in rows.values() for row in rs])
    under = [1 / row["cost_vs_opt"] for row in rows["greedy"]]
    para(
        f"Random and Greedy miss SLOs as in the paper ({slo} attainment over every setting) but "
        f"cost far less than the paper's: Random {cost['random']} the optimum's, Greedy "
        f"{cost['greedy']}. Greedy costs less than the optimum in {wins(under)} settings, as it "
        f"breaks SLOs the optimum keeps."
    )


def rollmux_fig10(name: str) -> None:
    """Fig. 10's plot in a sentence: where RollMux's gain reaches the paper's."""
    rows = [
        row
        for row in result(name).where(experiment="fig10")
        if row.get("paper_rollmux_gain_x") is not None
    ]
    gains = [row["rollmux_gain_x"] for row in rows]
    reach = [
        f"over {BASELINES[row['policy']]} on {row['benchmark']} "
        f"({x(row['rollmux_gain_x'])} against {x(row['paper_rollmux_gain_x'])})"
        for row in rows
        if row["rollmux_gain_x"] >= 0.97 * row["paper_rollmux_gain_x"]
    ]
    para(
        f"Fig. 10 (§7.2): RollMux gains over the baseline in {wins(gains)} benchmark-baseline "
        f"pairs ({span(gains, unit='x')}); it reaches the paper's gain only "
        f"{' and '.join(reach) if reach else 'nowhere'}, and falls short of it elsewhere."
    )


def rollmux_table4(name: str) -> None:
    """Table 4's plot in a sentence: RollMux's normalised throughput per benchmark against the
    paper's, and where Loom's Ideal falls below Solo-D."""
    r = result(name)
    cells = [
        f"{b} {_f2(row['normalized_throughput'])} (paper {_f2(row['paper_normalized_throughput'])})"
        for b in BENCHMARKS
        for row in r.where(experiment="table4", benchmark=b, policy="rollmux")
    ]
    ideal = [
        b
        for b in BENCHMARKS
        if r.value("normalized_throughput", experiment="table4", benchmark=b, policy="ideal") < 1
    ]
    para(
        f"Table 4: RollMux's training throughput over Solo-D's is {', '.join(cells)}. Loom's "
        f"Ideal (veRL co-located) is below Solo-D on {len(ideal)} of {len(BENCHMARKS)} "
        f"benchmarks ({', '.join(ideal) or 'none'}), where the paper's is its upper bound."
    )


def rollmux_fig15(name: str) -> None:
    """Fig. 15's figures: each scheduler's cost over the optimum and SLO attainment, beside
    the paper's."""
    rows = []
    for row in result(name).where(experiment="fig15"):
        if row.get("paper_cost_vs_opt") is None:
            continue
        rows.append(
            [
                f"`{row['policy']}`",
                f"{x(row['cost_vs_opt'])} ({x(row['paper_cost_vs_opt'])})",
                f"{pct(row['slo_attainment'])} ({pct(row['paper_slo_attainment'])})",
            ]
        )
    table(["scheduler", "cost over the optimum (paper)", "SLO attainment (paper)"], rows)
