"""The served systems' figures in the docs: the rollout benchmarks' stored results
(`benchmarks/bench_rollout_runtime.py`, `bench_rollout_router.py`, `soak_router.py`, `--json`)
and the first example's (`loom run grpo --json`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from figures.core import StoredResultError, f2, result, shown, table

__all__ = [
    "WORKLOADS",
    "continuous_table",
    "grpo_job",
    "heddle_layout_ratios",
    "heddle_layouts",
    "heddle_served",
    "heddle_served_rows",
    "router_overhead",
    "router_ratios",
    "served_claims",
    "served_setting",
    "served_sim",
    "served_systems",
    "served_targets",
    "soak_growth",
]

WORKLOADS = ("coding", "search", "math")


def served_setting(name: str) -> str:
    """A benchmark run's setting as a reader types it: its command without --json."""
    return f"`{shown(result(name).command)}`"


def _workloads(name: str) -> dict[str, dict[str, Any]]:
    return {r["workload"]: r for r in result(name).where(record="workload")}


def served_targets(names: Sequence[str], which: str = "best_peer_over_heddle") -> None:
    """Per benchmark run (a row), the best peer's (or baseline's) makespan over Heddle's per
    workload: above 1, Heddle is faster."""
    rows = []
    for name in names:
        by = _workloads(name)
        cells = [
            f2(by[w][which]) if w in by and by[w][which] is not None else "–" for w in WORKLOADS
        ]
        runs = {r["runs"] for r in result(name).where(record="system")}
        rows.append([served_setting(name), f"{max(runs)}", *cells])
    table(["setting", "runs", *WORKLOADS], rows)


def served_systems(name: str, workloads: Sequence[str] = WORKLOADS) -> None:
    """Every system's median makespan, its runs' spread, its ratio to Heddle's, the simulator's
    figures beside it and the router's CPU, per workload."""

    def cell(v: Any, fmt: Any) -> str:
        return "–" if v is None else fmt(v)

    rows = []
    for r in result(name).where(record="system"):
        if r["workload"] not in workloads:
            continue
        rows.append(
            [
                r["workload"],
                r["system"],
                f"{r['makespan_s']:,.1f}",
                ", ".join(f"{v:,.1f}" for v in r["makespan_runs_s"]),
                f"{100 * r['spread']:.0f}%" if r["runs"] > 1 else "–",  # one run: none
                cell(r.get("vs_heddle"), f2),
                cell(_real_over_sim(r), f2),
                cell(r.get("router_cpu_ms_per_turn"), f2),
                cell(r.get("router_cpu_share"), lambda v: f"{100 * v:.0f}%"),
            ]
        )
    table(
        [
            "workload",
            "system",
            "makespan (median)",
            "runs",
            "spread",
            "/ Heddle's",
            "real / simulated",
            "router CPU per turn (ms)",
            "router's share of CPU",
        ],
        rows,
    )


def _real_over_sim(r: dict[str, Any]) -> float | None:
    """A system's real makespan over the simulator's: with the served router modelled (the
    emulated runs), or on the engines' profile as served (the vLLM runs); None for peers."""
    if r.get("real_over_sim_routed") is not None:
        return float(r["real_over_sim_routed"])
    if r.get("sim_over_real"):
        return 1.0 / float(r["sim_over_real"])
    return None


def router_overhead(name: str) -> None:
    """What each router adds in front of an instant engine, per concurrency."""
    rows = []
    for r in result(name).where(record="overhead"):
        rows.append(
            [
                r["router"],
                r["concurrency"],
                f"{r['added_p50_ms']:.2f}",
                f"{r['added_p99_ms']:.2f}",
                "–"
                if r["router_cpu_ms_per_request"] is None
                else f2(r["router_cpu_ms_per_request"]),
                f"{r['requests_per_s']:,.0f}",
            ]
        )
    table(
        [
            "router",
            "concurrency",
            "added p50 (ms)",
            "added p99 (ms)",
            "CPU per request (ms)",
            "requests/s",
        ],
        rows,
    )


def router_ratios(name: str) -> dict[str, Any]:
    """Loom's router against sglang-router: the ratios the targets name."""
    rows = result(name).where(record="ratios")
    if len(rows) != 1:
        raise StoredResultError(f"{name}: {len(rows)} ratio records, expected one")
    return rows[0]


def soak_growth(name: str) -> dict[str, Any]:
    return result(name).one(record="growth")


def grpo_job(name: str, run: str, job: str) -> dict[str, Any]:
    """One job's summary in a `loom run grpo --json` result."""
    return result(name).one(record="job", run=run, job=job)


def continuous_table(name: str) -> None:
    """Each system's turns under continuous load: latency, waits, preemptions, throughput."""
    over = {r["system"]: r["throughput_over_fcfs"] for r in result(name).where(record="system")}
    rows = []
    for r in result(name).where(record="run"):
        rows.append(
            [
                r["system"],
                f"{r['p50_s']:.2f} s",
                f"{r['p99_s']:.1f} s",
                f"{r['longest_wait_s']:.1f} s",
                f"{r['preemptions_per_turn']:.2f}",
                f"{r['tokens_per_s']:,.0f}",
                f2(over[r["system"]]) if over.get(r["system"]) is not None else "–",
            ]
        )
    table(
        [
            "system",
            "turn latency p50",
            "p99",
            "longest wait in the router",
            "preemptions per turn",
            "output tokens/s",
            "/ fcfs's",
        ],
        rows,
    )


def served_claims(name: str) -> None:
    """The targets of Heddle served at paper scale, per workload: the best sglang-router
    policy's makespan over Heddle's (target >= 1.3), the best of verl, slime and verl*'s
    (target >= 1.2), and how many Loom systems ran within 10% of the simulator (with the
    served router modelled)."""
    by = _workloads(name)
    systems = result(name).where(record="system")
    rows = []
    for w in WORKLOADS:
        if w not in by:
            continue
        loom = [r for r in systems if r["workload"] == w and r.get("real_over_sim_routed")]
        close = sum(abs(r["real_over_sim_routed"] - 1) <= 0.10 for r in loom)
        rows.append(
            [
                w,
                f2(by[w]["best_peer_over_heddle"]),
                f2(by[w]["best_baseline_over_heddle"]),
                f"{close} of {len(loom)}",
            ]
        )
    table(
        [
            "workload",
            "best sglang-router policy / Heddle (target ≥ 1.3)",
            "best of verl, slime, verl* / Heddle (target ≥ 1.2)",
            "Loom systems within 10% of the simulator",
        ],
        rows,
    )


def served_sim(name: str, workload: str, system: str) -> dict[str, Any]:
    """A system's record of one workload in a benchmark run."""
    return result(name).one(record="system", workload=workload, system=system)


def heddle_layouts(name: str) -> None:
    """`bench_heddle_layouts.py`: per workload, each system's simulated makespan on each
    fleet (uniform at every degree, the annealer's layout, Heddle's planned one)."""
    doc = result(name)
    runs = list(doc.where(record="run"))
    fleets = list(dict.fromkeys(r["fleet"] for r in runs))
    layout = {r["fleet"]: r["layout"] for r in runs}

    def label(f: str) -> str:  # (the annealed and planned layouts differ by workload)
        degrees = layout[f]
        return f"{len(degrees)}×TP{degrees[0]}" if f.startswith("uniform") else f

    rows = []
    for w in WORKLOADS:
        mine = [r for r in runs if r["workload"] == w]
        if not mine:
            continue
        for system in dict.fromkeys(r["system"] for r in mine):
            cells = {r["fleet"]: r["makespan_s"] for r in mine if r["system"] == system}
            best = min(cells.values())
            rows.append(
                [
                    w,
                    system,
                    *(
                        "–"
                        if f not in cells
                        else f"**{cells[f]:,.0f}**"
                        if cells[f] == best
                        else f"{cells[f]:,.0f}"
                        for f in fleets
                    ),
                ]
            )
    table(["workload", "system", *(label(f) for f in fleets)], rows)


def heddle_layout_ratios(name: str) -> None:
    """The layout benchmark's ratios per workload: the best of verl/slime/verl* on its best
    uniform fleet, and on Heddle's planned fleet, over Heddle on its planned fleet; Heddle's
    ablations there (above 1: the mechanism helps)."""
    by = _workloads(name)
    rows = []
    for w in WORKLOADS:
        if w not in by:
            continue
        r = by[w]
        rows.append(
            [
                w,
                "+".join(map(str, r["planned_layout"])),
                "+".join(map(str, r["annealed_layout"])),
                f2(r["best_baseline_uniform_over_heddle_planned"]),
                f2(r["best_baseline_planned_over_heddle_planned"]),
                f2(r["heddle_annealed_s"] / r["heddle_planned_s"]),
                f2(r["heddle-no-kv-copies_over_heddle"]),
                f2(r["heddle-least-load_over_heddle"]),
                f2(r["heddle-fcfs_over_heddle"]),
                f2(r["heddle-no-kv-copies_over_heddle_annealed"]),
                f2(r["heddle-least-load_over_heddle_annealed"]),
                f2(r["heddle-fcfs_over_heddle_annealed"]),
            ]
        )
    table(
        [
            "workload",
            "planned",
            "annealed",
            "best baseline, best uniform / Heddle",
            "best baseline on planned / Heddle",
            "Heddle annealed / planned",
            "no KV copies",
            "least-load placement",
            "FCFS",
            "no KV copies (annealed)",
            "least-load (annealed)",
            "FCFS (annealed)",
        ],
        rows,
    )


def heddle_served_rows(name: str) -> list[dict[str, Any]]:
    """The served benchmark's bars: per workload and system (Heddle aside), Heddle's speedup
    over it (its median makespan over Heddle's), carrying the paper's Fig. 12 range where the
    system is one of its baselines."""
    from loom.experiments.heddle import SPEEDUP_PAPER

    paper = {"verl": "verl", "slime": "slime", "verl*": "verl_star"}
    rows: list[dict[str, Any]] = []
    for w in WORKLOADS:
        mine = {r["system"]: r for r in result(name).where(record="system", workload=w)}
        if "heddle" not in mine:
            continue
        heddle = mine["heddle"]
        rows += [
            {
                "workload": w,
                "system": system,
                "speedup": r["makespan_s"] / heddle["makespan_s"],
                "paper": SPEEDUP_PAPER["fig12"].get(paper.get(system, "")),
            }
            for system, r in mine.items()
            if system != "heddle"
        ]
    if not rows:
        raise StoredResultError(f"{name}: no workload with Heddle's makespan")
    return rows


def _over_heddle(mine: dict[str, Any], names: Sequence[str], best: bool) -> str:
    """Of one workload's systems (`mine`, by name): the fastest of `names` over Heddle's
    makespan, named (`best`), or the one system of `names`; "–" where none ran."""
    ran = [mine[s] for s in names if s in mine]
    if not ran:
        return "–"
    top = min(ran, key=lambda r: float(r["makespan_s"]))
    ratio = f2(top["makespan_s"] / mine["heddle"]["makespan_s"])
    return f"{ratio} ({top['system']})" if best else ratio


def heddle_served(name: str) -> None:
    """Per workload of a served benchmark run: Heddle's median makespan and spread, the best
    peer and the best of verl/slime/verl* (each by its median) over Heddle's, what each of
    Heddle's mechanisms buys (its ablation's makespan over Heddle's: KV copies, PPS,
    placement) and Heddle's real makespan over the simulator's."""
    from loom.bench.systems import BASELINES, PEERS

    rows = []
    for w in WORKLOADS:
        mine = {r["system"]: r for r in result(name).where(record="system", workload=w)}
        if "heddle" not in mine:
            continue
        heddle = mine["heddle"]
        real_sim = _real_over_sim(heddle)
        rows.append(
            [
                w,
                f"{heddle['makespan_s']:,.0f} s ± {100 * heddle['spread']:.0f}%",
                _over_heddle(mine, PEERS, best=True),
                _over_heddle(mine, BASELINES, best=True),
                _over_heddle(mine, ["heddle-nokv"], best=False),
                _over_heddle(mine, ["heddle-placement"], best=False),
                _over_heddle(mine, ["pps-only"], best=False),
                "–" if real_sim is None else f2(real_sim),
            ]
        )
    table(
        [
            "workload",
            "Heddle",
            "best peer / Heddle",
            "best baseline / Heddle",
            "no KV copies",
            "no PPS",
            "no placement",
            "Heddle real / simulated",
        ],
        rows,
    )
