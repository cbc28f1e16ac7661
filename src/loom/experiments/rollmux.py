"""RollMux's evaluation (§7) as runs of registered cluster policies on the cluster simulator.

Every policy sees the same seeded jobs (Table 6 profiles on Philly-shaped arrivals, or Table 3
job types) and the same per-iteration draws; ratios are measured within one run. Cost ratios
compare total dollars for the same jobs run to completion. `slo_attainment` is §4.2's (iteration
time within SLO x the worst-case solo estimate); `slo_attainment_vs_actual_solo` divides by the
job's actual solo time instead, a diagnostic no admission rule can bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from loom.cluster import CLUSTER_POLICIES, PolicyConfig
from loom.cluster.job import MuxJob
from loom.cluster.optimal import OptimalScheduler, OptTimeout
from loom.cluster.params import noise_model, testbed
from loom.cluster.rollmux.inter import RollMuxScheduler
from loom.cluster.sync import sync_times
from loom.core.jobs import PhaseKind
from loom.experiments.report import Record, Task, bar_plot, by_experiment
from loom.sim.cluster import ClusterResult, ClusterSimulator
from loom.sim.workloads.rl_jobs import (
    KINDS,
    micro_job,
    production_jobs,
    synthetic_philly,
    table6_jobs,
)

__all__ = ["plot", "run_experiments", "summary"]

SCHED_POLICIES = ("rollmux", "rollmux_slo_prune", "random", "greedy", "opt")
MICRO = {
    "temporal": ("type_a", "type_a"),
    "train": ("type_d", "type_d", "type_e"),
    "spatial": ("type_c", "type_d", "type_d"),
}
# The paper's values, as stated in its text and tables (none read off a chart):
# §7.2: RollMux's cost-efficiency gain over each baseline per micro-benchmark (Fig. 10a-c),
# "82%, 55.6%, and 46.8% over Solo-D, Gavel+, and veRL" and so on, as factors.
FIG10_PAPER_GAIN = {
    "temporal": {"solo_d": 1.82, "gavel_plus": 1.556, "verl": 1.468},
    "train": {"solo_d": 2.04, "gavel_plus": 1.619, "verl": 1.299},
    "spatial": {"solo_d": 2.11, "gavel_plus": 1.851, "verl": 1.661},
}
# Table 4: normalized training throughput (Solo Disaggregation = 1.00)
TABLE4_PAPER = {
    "temporal": {"solo_d": 1.00, "ideal": 1.07, "rollmux": 0.98},
    "train": {"solo_d": 1.00, "ideal": 1.07, "rollmux": 0.95},
    "spatial": {"solo_d": 1.00, "ideal": 1.11, "rollmux": 0.91},
}
# App. (Fig. 15, simulation, Mixed workload): cost over Offline Optimal's ("1.06x",
# "1.97x and 1.66x of optimal") and SLO attainment ("100%", "60% and 62%"), stated in the text
FIG15_PAPER = {
    "rollmux": (1.06, 1.00),
    "random": (1.97, 0.60),
    "greedy": (1.66, 0.62),
    "opt": (1.00, 1.00),
}
# §7.4 (testbed): RollMux is 1.84x more cost-efficient than Solo-D and 1.38x than veRL
TESTBED_PAPER = {"solo_d_cost_over_this_x": 1.84, "verl_cost_over_this_x": 1.38}
TABLE5_JOBS = (5, 9, 13, 100, 500, 1000, 2000)
GANTT_ITERATIONS = 3


def _run(kind: str, jobs: list[MuxJob], seed: int, max_group: int = 5) -> ClusterResult:
    bed = testbed()
    cfg = PolicyConfig(
        bed=bed, max_group_size=max_group, migration_s=noise_model().migration_s, seed=seed
    )
    return ClusterSimulator(bed, seed=seed).run(CLUSTER_POLICIES.get(kind)(cfg), jobs)


def _sched_rows(
    exp: str, jobs: list[MuxJob], seed: int, max_group: int, **params: object
) -> list[Record]:
    res = {k: _run(k, jobs, seed, max_group) for k in SCHED_POLICIES}
    # NOTE: every policy runs the same jobs to completion, so total dollars compare like for
    # like; dollars per hour would divide by each policy's own makespan, and a policy that slows
    # jobs down would look cheaper per hour.
    opt = res["opt"].cost_usd
    return [
        {
            "experiment": exp,
            "policy": k,
            **params,
            "cost_per_h": r.cost_per_h,
            "cost_vs_opt": r.cost_usd / opt,
            "slo_attainment": r.slo_attainment,
            "slo_attainment_vs_actual_solo": r.slo_attainment_vs_actual_solo,
            "peak_gpus": r.peak_rollout_gpus + r.peak_training_gpus,
        }
        for k, r in res.items()
    ]


def _trace_jobs(kind: str, seed: int, quick: bool, slo: float | None = None) -> list[MuxJob]:
    return table6_jobs(kind, synthetic_philly(seed, jobs=60 if quick else 300), seed, slo=slo)


def fig14a(seed: int, quick: bool) -> list[Record]:
    return [
        row
        for kind in KINDS[:3]
        for row in _sched_rows("fig14a", _trace_jobs(kind, seed, quick), seed, 5, workload=kind)
    ]


def fig14b(seed: int, quick: bool) -> list[Record]:
    rows = []
    for slo in (1.2, 1.5, 2.0, None):
        jobs = _trace_jobs("mixed", seed, quick, slo)
        rows += _sched_rows("fig14b", jobs, seed, 5, slo="unif(1,2)" if slo is None else str(slo))
    return rows


def fig14c(seed: int, quick: bool) -> list[Record]:
    jobs = _trace_jobs("mixed", seed, quick)
    return [
        row for g in (2, 3, 4, 5) for row in _sched_rows("fig14c", jobs, seed, g, max_group_size=g)
    ]


def fig15(seed: int, quick: bool) -> list[Record]:
    rows = _sched_rows("fig15", _trace_jobs("mixed", seed, quick), seed, 5, workload="mixed")
    for r in rows:
        cost, slo = FIG15_PAPER.get(r["policy"], (None, None))
        r["paper_cost_vs_opt"], r["paper_slo_attainment"] = cost, slo
    return rows


def testbed_cmp(seed: int, quick: bool) -> list[Record]:
    """§7.4: cost, peak GPUs per pool and bubbles of RollMux against solo_d and verl (and the
    arrival-time optimum, for scale) on the production-shaped trace: Table 3 job types over two
    weeks, mean duration 27.9 h, SLOs from Unif(1, 2)."""
    jobs = production_jobs(seed, 60 if quick else None)
    res = {k: _run(k, jobs, seed) for k in ("rollmux", "solo_d", "verl", "gavel_plus", "opt")}
    solo, verl = res["solo_d"].cost_usd, res["verl"].cost_usd
    return [
        {
            "experiment": "testbed",
            "policy": k,
            "cost_per_h": r.cost_per_h,
            "solo_d_cost_over_this_x": solo / r.cost_usd,
            "verl_cost_over_this_x": verl / r.cost_usd,
            "peak_rollout_gpus": r.peak_rollout_gpus,
            "peak_training_gpus": r.peak_training_gpus,
            "rollout_bubble_share": r.bubble_share("rollout"),
            "training_bubble_share": r.bubble_share("training"),
            "slo_attainment": r.slo_attainment,
            **{f"paper_{m}": v for m, v in TESTBED_PAPER.items() if k == "rollmux"},
        }
        for k, r in res.items()
    ]


def _gantt_rows(bench: str, n_jobs: int, res: ClusterResult, seed: int) -> list[Record]:
    """Every phase of GANTT_ITERATIONS meta-iterations of the groups RollMux formed, with the
    jobs' actual (sampled) phase times: the data of Fig. 10's timelines."""
    _t, layouts = res.layouts[n_jobs - 1]  # NOTE: all jobs arrive at 0; this is after the last
    sim = ClusterSimulator(testbed(), seed=seed)
    rows: list[Record] = []
    for layout in layouts:
        for run in sim.schedule(layout, GANTT_ITERATIONS).runs:
            rollout = run.kind == PhaseKind.ROLLOUT
            rows.append(
                {
                    "experiment": "fig10_gantt",
                    "benchmark": bench,
                    "policy": "rollmux",
                    "group": layout.group_id,
                    "job": run.job_id,
                    "phase": run.kind.value,
                    "iteration": run.iteration,
                    "nodes": ",".join(f"{'R' if rollout else 'T'}{n}" for n in run.nodes),
                    "start_s": run.start,
                    "head_end_s": run.head_end,
                    "tail_start_s": run.tail_start,
                    "end_s": run.end,
                }
            )
    return rows


def fig10_table4(seed: int, quick: bool) -> list[Record]:
    rows: list[Record] = []
    iters = 30 if quick else 200
    for bench, types in MICRO.items():
        jobs = [micro_job(t, f"{bench}{i}-{t}", iters) for i, t in enumerate(types)]
        res = {k: _run(k, jobs, seed) for k in ("rollmux", "solo_d", "gavel_plus", "verl")}
        rows += _gantt_rows(bench, len(jobs), res["rollmux"], seed)
        eff = {k: sum(j.iterations for j in jobs) / r.cost_usd for k, r in res.items()}
        for k, r in res.items():
            rows.append(
                {
                    "experiment": "fig10",
                    "benchmark": bench,
                    "policy": k,
                    "iterations_per_usd": eff[k],
                    "rollmux_gain_x": eff["rollmux"] / eff[k],
                    "paper_rollmux_gain_x": FIG10_PAPER_GAIN[bench].get(k),
                    "cost_per_h": r.cost_per_h,
                }
            )
        norm = {
            k: sum(o.solo_iteration_s / o.iteration_s for o in r.outcomes) / len(jobs)
            for k, r in res.items()
        }
        for k, label in (("solo_d", "solo_d"), ("verl", "ideal"), ("rollmux", "rollmux")):
            rows.append(
                {
                    "experiment": "table4",
                    "benchmark": bench,
                    "policy": label,
                    "normalized_throughput": norm[k] / norm["solo_d"],
                    "paper_normalized_throughput": TABLE4_PAPER[bench][label],
                }
            )
    return rows


def fig12(seed: int, quick: bool) -> list[Record]:
    bed = testbed()
    rows = []
    for model, params_b in (("qwen2.5-7b", 7.61), ("qwen2.5-14b", 14.7), ("qwen2.5-32b", 32.5)):
        for gpus in (8, 16):
            st = sync_times(params_b, gpus, gpus, bed)
            for policy, t in (("verl", st.flat_s), ("rollmux", st.topology_aware_s)):
                rows.append(
                    {
                        "experiment": "fig12",
                        "model": model,
                        "gpus": gpus,
                        "policy": policy,
                        "sync_s": t,
                        "speedup_x": st.speedup,
                    }
                )
    return rows


def _concurrent(n: int, seed: int) -> list[MuxJob]:
    trace = synthetic_philly(seed, jobs=n + 1, span_h=0.0)
    return table6_jobs("mixed", trace, seed)


def table5(seed: int, quick: bool) -> list[Record]:
    bed = testbed()
    cfg = PolicyConfig(bed=bed, migration_s=noise_model().migration_s, seed=seed)
    rows = []
    for n in TABLE5_JOBS:
        jobs = _concurrent(n, seed)
        sched = RollMuxScheduler(cfg)
        groups: dict[int, object] = {}
        for j in jobs[:n]:
            p = sched.on_arrival(j, tuple(groups.values()), len(groups))  # type: ignore[arg-type]
            groups[p.layout.group_id] = p.layout
        t0 = time.perf_counter()
        reps = 5
        for _ in range(reps):
            sched.on_arrival(jobs[n], tuple(groups.values()), len(groups))  # type: ignore[arg-type]
        ms = (time.perf_counter() - t0) * 1e3 / reps
        rows.append(
            {
                "experiment": "table5",
                "policy": "rollmux",
                "jobs": n,
                "groups": len(groups),
                "decision_ms": ms,
            }
        )
        if n <= 13:
            t0 = time.perf_counter()
            deadline = t0 + (10.0 if quick else 60.0)
            opt = OptimalScheduler(cfg, give_up=partial(_past, deadline))
            try:
                opt.solve(jobs[: n + 1])
                ms = (time.perf_counter() - t0) * 1e3
            except OptTimeout:
                ms = float("nan")
            rows.append(
                {
                    "experiment": "table5",
                    "policy": "opt",
                    "jobs": n,
                    "groups": len(groups),
                    "decision_ms": ms,
                }
            )
    return rows


EXPERIMENTS: dict[str, Callable[[int, bool], list[Record]]] = {
    "fig10/table4": fig10_table4,
    "fig12": fig12,
    "fig14a": fig14a,
    "fig14b": fig14b,
    "fig14c": fig14c,
    "fig15": fig15,
    "testbed": testbed_cmp,
    "table5": table5,
}


def run_experiments(seed: int, quick: bool) -> tuple[int, Iterator[Task]]:
    tasks = [(name, (lambda f=f: f(seed, quick))) for name, f in EXPERIMENTS.items()]
    return len(tasks), iter(tasks)


def _past(deadline: float) -> bool:
    return time.perf_counter() > deadline


YLABELS = {
    "cost_vs_opt": "cost / Offline Optimal's (×)",
    "slo_attainment": "SLO attainment (fraction of jobs)",
}
XLABELS = {
    "workload": "workload",
    "slo": "job SLO (× solo iteration time)",
    "max_group_size": "max group size (jobs)",
}


def plot(records: list[Record], out: Path) -> list[Path]:
    """Fig. 10, 12, 14 and 15, Table 4 and §7.4's testbed as PNG charts under `out`, the
    paper's stated values as black markers."""
    by = by_experiment(records)
    paths = []
    for exp, x in (
        ("fig14a", "workload"),
        ("fig14b", "slo"),
        ("fig14c", "max_group_size"),
        ("fig15", "workload"),
    ):
        for metric in ("cost_vs_opt", "slo_attainment"):
            if exp in by:
                paths.append(
                    bar_plot(
                        by[exp],
                        x=x,
                        hue="policy",
                        metric=metric,
                        paper=f"paper_{metric}" if exp == "fig15" else None,
                        xlabel=XLABELS[x],
                        ylabel=YLABELS[metric],
                        path=out / f"{exp}_{metric}.png",
                        title=f"Fig. {exp[3:]}: {metric.replace('_', ' ')}",
                    )
                )
    if "fig10" in by:
        paths.append(
            bar_plot(
                by["fig10"],
                x="benchmark",
                hue="policy",
                metric="iterations_per_usd",
                xlabel="micro-benchmark",
                ylabel="cost efficiency (iterations / $)",
                path=out / "fig10.png",
                title="Fig. 10: cost efficiency",
            )
        )
        paths.append(
            bar_plot(
                by["fig10"],
                x="benchmark",
                hue="policy",
                metric="rollmux_gain_x",
                paper="paper_rollmux_gain_x",  # §7.2
                xlabel="micro-benchmark",
                ylabel="RollMux's gain (×)",
                path=out / "fig10_gain.png",
                title="Fig. 10: RollMux's gain in cost efficiency",
            )
        )
    if "table4" in by:
        paths.append(
            bar_plot(
                by["table4"],
                x="benchmark",
                hue="policy",
                metric="normalized_throughput",
                paper="paper_normalized_throughput",  # Table 4
                xlabel="micro-benchmark",
                ylabel="throughput / Solo-D's (ratio)",
                path=out / "table4.png",
                title="Table 4: normalized training throughput",
            )
        )
    if "fig10_gantt" in by:
        for bench in dict.fromkeys(str(r["benchmark"]) for r in by["fig10_gantt"]):
            rows = [r for r in by["fig10_gantt"] if r["benchmark"] == bench]
            paths.append(gantt_plot(rows, out / f"fig10_gantt_{bench}.png", f"Fig. 10: {bench}"))
    if "fig12" in by:
        paths.append(
            bar_plot(
                by["fig12"],
                x="model",
                hue="policy",
                metric="sync_s",
                facet="gpus",
                ylabel="weight sync time (s)",
                path=out / "fig12.png",
                title="Fig. 12: sync time, by GPUs per side",
            )
        )
    if "testbed" in by:
        for metric in TESTBED_PAPER:
            paths.append(
                bar_plot(
                    [{**r, "trace": "production"} for r in by["testbed"]],
                    x="trace",
                    hue="policy",
                    metric=metric,
                    paper=f"paper_{metric}",  # §7.4
                    xlabel="trace",
                    ylabel=f"{metric.split('_cost')[0]}'s cost / policy's (×)",
                    path=out / f"testbed_{metric.split('_cost')[0]}.png",
                    title="§7.4 testbed: cost efficiency",
                )
            )
    return paths


def _lane(r: Record, node: str) -> str:
    return f"g{r['group']} {node}" if r["phase"] == PhaseKind.ROLLOUT.value else f"g{r['group']} T"


def gantt_plot(rows: list[Record], path: Path, title: str) -> Path:
    """Both pools' timelines: one lane per rollout node and one per group's training pool, a
    colour per job; a migrated rollout's straggler tail is the thin hatched bar after its head."""
    import matplotlib.pyplot as plt  # NOTE: report.py selected the headless backend

    jobs = list(dict.fromkeys(str(r["job"]) for r in rows))
    colour = {j: plt.get_cmap("tab10")(i % 10) for i, j in enumerate(jobs)}
    pools = (
        (PhaseKind.ROLLOUT.value, "rollout\nH20"),
        (PhaseKind.TRAIN.value, "training\nH800"),
    )
    lanes = {
        phase: sorted(
            {_lane(r, n) for r in rows if r["phase"] == phase for n in str(r["nodes"]).split(",")}
        )
        for phase, _label in pools
    }
    heights = [max(len(lanes[phase]), 1) for phase, _label in pools]
    fig, axes = plt.subplots(
        2, 1, sharex=True, figsize=(9, 1.4 + 0.45 * sum(heights)), height_ratios=heights
    )
    bar = {"edgecolor": "k", "lw": 0.4}
    for ax, (phase, label) in zip(axes, pools, strict=True):
        for r in (r for r in rows if r["phase"] == phase):
            start, end, tail = float(r["start_s"]), float(r["end_s"]), r["tail_start_s"]
            head_end = end if tail is None else float(r["head_end_s"])
            for node in str(r["nodes"]).split(","):
                y = lanes[phase].index(_lane(r, node))
                ax.barh(y, head_end - start, left=start, color=colour[str(r["job"])], **bar)
                if tail is not None:
                    ax.barh(
                        y,
                        end - float(tail),
                        left=float(tail),
                        height=0.3,
                        color=colour[str(r["job"])],
                        hatch="///",
                        zorder=3,  # over the next job's head, which starts beside it
                        **bar,
                    )
        ax.set_yticks(range(len(lanes[phase])), lanes[phase])
        ax.set_ylabel(label, fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[j]) for j in jobs]
    axes[0].legend(
        handles, jobs, fontsize=7, loc="lower left", bbox_to_anchor=(0, 1), ncol=len(jobs)
    )
    axes[1].set_xlabel("time (s)")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def summary(records: list[Record]) -> list[Record]:
    rows = []
    for exp in ("fig14a", "fig14b", "fig14c", "fig15"):
        sub = [r for r in records if r["experiment"] == exp]
        for pol in SCHED_POLICIES:
            mine = [r for r in sub if r["policy"] == pol]
            if mine:
                rows.append(
                    {
                        "experiment": "summary",
                        "source": exp,
                        "policy": pol,
                        "cost_vs_opt_min": min(r["cost_vs_opt"] for r in mine),
                        "cost_vs_opt_max": max(r["cost_vs_opt"] for r in mine),
                        "slo_attainment_min": min(r["slo_attainment"] for r in mine),
                        "slo_attainment_max": max(r["slo_attainment"] for r in mine),
                    }
                )
    return rows
