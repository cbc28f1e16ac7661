"""RollMux's evaluation (§7) as runs of registered cluster policies on the cluster simulator.

Every policy sees the same seeded jobs (Table 6 profiles on Philly-shaped arrivals, or Table 3
job types) and the same per-iteration draws; ratios are measured within one run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from loom.cluster import CLUSTER_POLICIES, PolicyConfig
from loom.cluster.job import MuxJob
from loom.cluster.optimal import OptimalScheduler, OptTimeout
from loom.cluster.params import noise_model, testbed
from loom.cluster.rollmux.inter import RollMuxScheduler
from loom.cluster.sync import sync_times
from loom.experiments.report import Record, bar_plot
from loom.sim.cluster import ClusterResult, ClusterSimulator
from loom.sim.workloads.rl_jobs import KINDS, micro_job, synthetic_philly, table6_jobs

__all__ = ["plot", "run_experiments", "summary"]

SCHED_POLICIES = ("rollmux", "random", "greedy", "opt")
MICRO = {
    "temporal": ("type_a", "type_a"),
    "train": ("type_d", "type_d", "type_e"),
    "spatial": ("type_c", "type_d", "type_d"),
}
TABLE5_JOBS = (5, 9, 13, 100, 500, 1000, 2000)


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
    opt = res["opt"].cost_per_h
    return [
        {
            "experiment": exp,
            "policy": k,
            **params,
            "cost_per_h": r.cost_per_h,
            "cost_vs_opt": r.cost_per_h / opt,
            "slo_attainment": r.slo_attainment,
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
    return _sched_rows("fig15", _trace_jobs("mixed", seed, quick), seed, 5, workload="mixed")


def testbed_cmp(seed: int, quick: bool) -> list[Record]:
    """§7.4: cost per hour, peak GPUs per pool and bubbles against solo_d and verl."""
    jobs = _trace_jobs("mixed", seed, quick)
    res = {k: _run(k, jobs, seed) for k in ("rollmux", "solo_d", "verl", "gavel_plus")}
    solo = res["solo_d"]
    return [
        {
            "experiment": "testbed",
            "policy": k,
            "cost_per_h": r.cost_per_h,
            "solo_d_cost_over_this_x": solo.cost_per_h / r.cost_per_h,
            "peak_rollout_gpus": r.peak_rollout_gpus,
            "peak_training_gpus": r.peak_training_gpus,
            "rollout_bubble_share": r.bubble_share("rollout"),
            "training_bubble_share": r.bubble_share("training"),
            "slo_attainment": r.slo_attainment,
        }
        for k, r in res.items()
    ]


def fig10_table4(seed: int, quick: bool) -> list[Record]:
    rows: list[Record] = []
    iters = 30 if quick else 200
    for bench, types in MICRO.items():
        jobs = [micro_job(t, f"{bench}{i}-{t}", iters) for i, t in enumerate(types)]
        res = {k: _run(k, jobs, seed) for k in ("rollmux", "solo_d", "gavel_plus", "verl")}
        eff = {k: sum(j.iterations for j in jobs) / r.cost_usd for k, r in res.items()}
        for k, r in res.items():
            rows.append(
                {
                    "experiment": "fig10",
                    "benchmark": bench,
                    "policy": k,
                    "iterations_per_usd": eff[k],
                    "rollmux_gain_x": eff["rollmux"] / eff[k],
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
            opt = OptimalScheduler(cfg, budget_s=10.0 if quick else 60.0)
            t0 = time.perf_counter()
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


def run_experiments(
    seed: int, quick: bool
) -> tuple[int, Iterator[tuple[str, Callable[[], list[Record]]]]]:
    tasks = [(name, (lambda f=f: f(seed, quick))) for name, f in EXPERIMENTS.items()]
    return len(tasks), iter(tasks)


def plot(records: list[Record], out: Path) -> list[Path]:
    by: dict[str, list[Record]] = {}
    for r in records:
        by.setdefault(str(r["experiment"]), []).append(r)
    paths = []
    for exp, x in (("fig14a", "workload"), ("fig14b", "slo"), ("fig14c", "max_group_size")):
        for metric in ("cost_vs_opt", "slo_attainment"):
            if exp in by:
                paths.append(
                    bar_plot(
                        by[exp],
                        x=x,
                        hue="policy",
                        metric=metric,
                        path=out / f"{exp}_{metric}.png",
                        title=f"{exp}: {metric}",
                    )
                )
    if "fig10" in by:
        paths.append(
            bar_plot(
                by["fig10"],
                x="benchmark",
                hue="policy",
                metric="iterations_per_usd",
                path=out / "fig10.png",
                title="Fig. 10: cost efficiency",
            )
        )
    if "fig12" in by:
        paths.append(
            bar_plot(
                by["fig12"],
                x="model",
                hue="policy",
                metric="sync_s",
                facet="gpus",
                path=out / "fig12.png",
                title="Fig. 12: sync time (s)",
            )
        )
    return paths


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
