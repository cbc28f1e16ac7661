"""Heddle's evaluation (§7) as runs of registered policies on the rollout simulator.

Every system sees the same seeded batch of trajectories per (workload, model). Baselines
use round-robin scheduling and homogeneous model parallelism (1, 1, 2 for Qwen3-8B/14B/32B,
§7.1) with 100 trajectories per worker; Heddle gets the same GPUs and the same global batch,
and chooses its own layout. Ablations (Fig. 14–16) swap one component of Heddle at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from loom.core.topology import GpuType
from loom.core.trajectory import TrajectorySpec, WorkloadKind
from loom.experiments.heddle_predictors import evaluate_predictors
from loom.experiments.report import Record, Task, bar_plot, by_experiment
from loom.rollout.baselines import CacheAwareRouter, HybridRouter, LeastLoadRouter
from loom.rollout.heddle.placement import presorted_dp_hetero
from loom.rollout.heddle.planner import AnnealingPlanner, FixedPlanner
from loom.rollout.heddle.predictor import ProgressivePredictor
from loom.rollout.heddle.resource_manager import DEFAULT_DEGREES, anneal_allocation
from loom.rollout.heddle.router import REPARTITION, HeddleRouter
from loom.rollout.policy import SCHEDULERS, PlacementKind, Router, SchedulerKind, WorkerLayout
from loom.sim.rollout.cost import SimulatedDegreeCost
from loom.sim.rollout.simulator import RolloutConfig, RolloutResult, RolloutSimulator
from loom.sim.workloads.agentic import AgenticWorkload

__all__ = ["HeddleScale", "Scenario", "SystemSpec", "plot", "run_experiments"]

MODELS = ("qwen3-8b", "qwen3-14b", "qwen3-32b")
BASE_TP = {"qwen3-8b": 1, "qwen3-14b": 1, "qwen3-32b": 2}  # §7.1: max-throughput MP
WORKLOADS = (WorkloadKind.CODING, WorkloadKind.SEARCH, WorkloadKind.MATH)
ABLATION_MODEL = "qwen3-14b"  # §7.2–7.4 use Qwen3-14B


@dataclass(frozen=True, kw_only=True)
class HeddleScale:
    """Cluster and batch size: the paper's 64 GPUs, or 8 for `--quick`."""

    gpus: int
    per_worker_batch: int = 100  # §7.1: 100 trajectories per baseline worker
    samples: int = 16
    gpu: GpuType = GpuType.H100
    history_epochs: tuple[int, ...] = (0, 1, 2)

    @classmethod
    def for_run(cls, quick: bool) -> HeddleScale:
        return cls(gpus=8) if quick else cls(gpus=64)

    def num_prompts(self, model: str) -> int:
        workers = self.gpus // BASE_TP[model]
        return max(1, workers * self.per_worker_batch // self.samples)


@dataclass(frozen=True, kw_only=True)
class SystemSpec:
    """One rollout system: a scheduler, a placement and a layout (None = Heddle's planner)."""

    scheduler: SchedulerKind
    placement: PlacementKind
    degree: int | None = None  # homogeneous degree; None: trajectory-adaptive (§6)
    skew_threshold: float = 32.0
    multi_worker: bool = field(
        default=False,
        metadata={"help": "Heddle's planner may not put every GPU into one worker"},
    )
    repartition: float | None = field(
        default=None,
        metadata={
            "help": "Heddle's placement: None keeps §5.3's scaled partition sizes alone; a "
            "fraction re-runs the presorted DP whenever that share of the active "
            "trajectories has finished (Loom's extension)"
        },
    )


def baseline_systems(model: str) -> dict[str, SystemSpec]:
    tp = BASE_TP[model]
    rr = SchedulerKind.RR
    return {
        "verl": SystemSpec(scheduler=rr, placement=PlacementKind.CACHE_AWARE, degree=tp),
        "slime": SystemSpec(scheduler=rr, placement=PlacementKind.LEAST_LOAD, degree=tp),
        "verl_star": SystemSpec(scheduler=rr, placement=PlacementKind.HYBRID, degree=tp),
    }


HEDDLE = SystemSpec(
    scheduler=SchedulerKind.PPS, placement=PlacementKind.HEDDLE, repartition=REPARTITION
)
"""Loom's Heddle in Fig. 12: PPS, Heddle's placement with Loom's re-partitioning, the planner's
layout. The ablations (Fig. 14-16) run §5.3's rule instead, and the extension as its own row."""

EXTENSION = "+repartition"
"""Suffix of an ablation row that runs Loom's re-partitioning beside §5.3's rule."""


@dataclass
class Scenario:
    """One (workload, model) cell: its batch, history, predictions and cost model."""

    kind: WorkloadKind
    model: str
    scale: HeddleScale
    seed: int
    trajs: list[TrajectorySpec] = field(init=False)
    history: list[TrajectorySpec] = field(init=False)
    predictions: list[tuple[float, ...]] = field(init=False)
    cost: SimulatedDegreeCost = field(init=False)
    config: RolloutConfig = field(init=False)
    _layouts: dict[bool, WorkerLayout] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        wl = AgenticWorkload(
            kind=self.kind,
            model=self.model,
            num_prompts=self.scale.num_prompts(self.model),
            samples=self.scale.samples,
            prompt_seed=self.seed,
        )
        self.workload = wl
        self.trajs = wl.sample(100 + self.seed)
        self.history = [t for e in self.scale.history_epochs for t in wl.sample(e)]
        self.predictions = ProgressivePredictor().fit(self.history).predict_steps(self.trajs)
        self.config = RolloutConfig(model=self.model, gpu=self.scale.gpu)
        recent = wl.sample(self.scale.history_epochs[-1])
        self.cost = SimulatedDegreeCost(recent, self.config, max_group=len(self.trajs))

    @property
    def initial_lengths(self) -> list[float]:
        return [p[0] for p in self.predictions]

    def heddle_layout(self, multi_worker: bool = False) -> WorkerLayout:
        """Heddle's annealed layout; `multi_worker` excludes a degree that takes every GPU."""
        if multi_worker not in self._layouts:
            degrees: tuple[int, ...] = DEFAULT_DEGREES
            if multi_worker:
                degrees = tuple(d for d in DEFAULT_DEGREES if d < self.scale.gpus)
            planner = AnnealingPlanner(cost=self.cost, degrees=degrees, seed=self.seed)
            self._layouts[multi_worker] = planner.plan(self.initial_lengths, self.scale.gpus)
        return self._layouts[multi_worker]

    def layout(self, spec: SystemSpec) -> WorkerLayout:
        if spec.degree is None:
            return self.heddle_layout(spec.multi_worker)
        return FixedPlanner(degree=spec.degree).plan(self.initial_lengths, self.scale.gpus)

    def router(self, spec: SystemSpec) -> Router:
        return ROUTER_FACTORIES[spec.placement](self, spec)

    def simulate(self, spec: SystemSpec) -> RolloutResult:
        sim = RolloutSimulator(
            self.trajs,
            self.layout(spec),
            SCHEDULERS.get(spec.scheduler)(),
            self.router(spec),
            self.config,
            predictions=self.predictions,
        )
        return sim.run()


ROUTER_FACTORIES: dict[PlacementKind, Callable[[Scenario, SystemSpec], Router]] = {
    PlacementKind.HEDDLE: lambda s, spec: HeddleRouter(s.cost, repartition=spec.repartition),
    PlacementKind.CACHE_AWARE: lambda s, _: CacheAwareRouter(),
    PlacementKind.LEAST_LOAD: lambda s, _: LeastLoadRouter(),
    PlacementKind.HYBRID: lambda s, spec: HybridRouter(threshold=spec.skew_threshold),
}


def _result_fields(res: RolloutResult) -> Record:
    return {
        "trajectories": len(res.finish_s),
        "throughput_tok_s": res.throughput_tok_s,
        "rollout_time_s": res.makespan_s,
        "output_tokens": res.output_tokens,
        "prefill_tokens": res.prefill_tokens,
        "preemptions": res.preemptions,
        "migrations": res.migrations,
    }


# ---- the experiments: each yields (label, thunk) so the caller can show progress ----------


def fig12_tasks(
    cells: Callable[[WorkloadKind, str], Scenario], models: tuple[str, ...]
) -> Iterator[Task]:
    for model in models:
        for kind in WORKLOADS:
            systems = {"heddle": HEDDLE, **baseline_systems(model)}
            for name, spec in systems.items():

                def run(
                    kind: WorkloadKind = kind,
                    model: str = model,
                    name: str = name,
                    spec: SystemSpec = spec,
                ) -> list[Record]:
                    scn = cells(kind, model)
                    res = scn.simulate(spec)
                    layout = scn.layout(spec)
                    return [
                        {
                            "experiment": "fig12",
                            "workload": kind.value,
                            "model": model,
                            "policy": name,
                            "gpus": layout.num_gpus,
                            "layout": "x".join(map(str, layout.degrees)),
                            **_result_fields(res),
                        }
                    ]

                yield f"fig12 {model} {kind.value} {name}", run


def fig13_tasks(scale: HeddleScale, seed: int) -> Iterator[Task]:
    for kind in WORKLOADS:

        def run(kind: WorkloadKind = kind) -> list[Record]:
            wl = AgenticWorkload(
                kind=kind,
                model=ABLATION_MODEL,
                num_prompts=scale.num_prompts(ABLATION_MODEL),
                samples=scale.samples,
                prompt_seed=seed,
            )
            rows = evaluate_predictors(wl, scale.history_epochs, 100 + seed)
            return [{"experiment": "fig13", "model": ABLATION_MODEL, **r} for r in rows]

        yield f"fig13 {kind.value}", run


def _ablation_tasks(
    exp: str,
    cells: Callable[[WorkloadKind, str], Scenario],
    variants: dict[str, SystemSpec],
    extra: Callable[[RolloutResult], Record],
) -> Iterator[Task]:
    for kind in WORKLOADS:
        for name, spec in variants.items():

            def run(
                kind: WorkloadKind = kind, name: str = name, spec: SystemSpec = spec
            ) -> list[Record]:
                scn = cells(kind, ABLATION_MODEL)
                res = scn.simulate(spec)
                layout = scn.layout(spec)
                return [
                    {
                        "experiment": exp,
                        "workload": kind.value,
                        "model": ABLATION_MODEL,
                        "policy": name,
                        "layout": "x".join(map(str, layout.degrees)),
                        **_result_fields(res),
                        **extra(res),
                    }
                ]

            yield f"{exp} {kind.value} {name}", run


def _with_extension(variants: dict[str, SystemSpec], name: str) -> dict[str, SystemSpec]:
    """`variants` (§5.3's rule) plus `name` again under Loom's re-partitioning extension."""
    return {**variants, name + EXTENSION: replace(variants[name], repartition=REPARTITION)}


SCHEDULER_ABLATION = (SchedulerKind.PPS, SchedulerKind.FCFS, SchedulerKind.RR, SchedulerKind.SJF)


def fig14_tasks(cells: Callable[[WorkloadKind, str], Scenario]) -> Iterator[Task]:
    """Schedulers compared on Heddle's placement under §5.3's rule, on Heddle's layout with at
    least two workers, as in fig15; `pps+repartition` adds Loom's extension. NOTE: at
    8 GPUs (`--quick`) Heddle's planner picks one TP8 worker, which admits the whole batch at
    once (1,024 running turns), so no turn queues and the four schedulers tie within 0.5%; the
    multi-worker constraint binds only there. `mean_active_trajectories` (unfinished ones,
    averaged over the rollout) shows the price of longest-first: the short trajectories it
    defers stay alive, share the batches of the long ones and slow their decoding."""
    variants = {
        k.value: SystemSpec(scheduler=k, placement=PlacementKind.HEDDLE, multi_worker=True)
        for k in SCHEDULER_ABLATION
    }
    return _ablation_tasks(
        "fig14",
        cells,
        _with_extension(variants, SchedulerKind.PPS.value),
        lambda r: {
            "longest_queue_delay_s": r.longest_queue_delay_s,
            "mean_active_trajectories": r.mean_active,
        },
    )


def fig15_tasks(cells: Callable[[WorkloadKind, str], Scenario]) -> Iterator[Task]:
    """Placements compared on one layout: Heddle's, but with at least two workers; `heddle`
    is §5.3's rule, `heddle+repartition` Loom's extension. NOTE: at 8 GPUs (`--quick`)
    Heddle's planner picks a single TP8 worker, on which every placement is the same; the
    multi-worker constraint binds only there (at 64 GPUs no degree takes all)."""
    pps = SchedulerKind.PPS
    variants = {
        "heddle": SystemSpec(scheduler=pps, placement=PlacementKind.HEDDLE, multi_worker=True),
        # §7.3: least-load beyond a load-imbalance threshold, else longest cached prefix.
        "least_load": SystemSpec(
            scheduler=pps, placement=PlacementKind.HYBRID, skew_threshold=2.0, multi_worker=True
        ),
        "cache_aware": SystemSpec(
            scheduler=pps, placement=PlacementKind.CACHE_AWARE, multi_worker=True
        ),
    }
    return _ablation_tasks("fig15", cells, _with_extension(variants, "heddle"), lambda r: {})


def fig16_tasks(cells: Callable[[WorkloadKind, str], Scenario]) -> Iterator[Task]:
    """Heddle's planner against homogeneous layouts, all under §5.3's placement rule;
    `heddle+repartition` adds Loom's extension."""
    pps, hp = SchedulerKind.PPS, PlacementKind.HEDDLE
    variants = {
        "heddle": SystemSpec(scheduler=pps, placement=hp),
        "fix1": SystemSpec(scheduler=pps, placement=hp, degree=1),
        "fix8": SystemSpec(scheduler=pps, placement=hp, degree=8),
    }
    return _ablation_tasks("fig16", cells, _with_extension(variants, "heddle"), lambda r: {})


# Table 2 (§7.5) as stated: seconds per decision of the placement DP and of the resource
# manager, per model and workload (coding, search, math), at the paper's 64 GPUs
TABLE2_PAPER = {
    ("qwen3-8b", "placement"): (0.036, 0.037, 0.036),
    ("qwen3-8b", "resource_manager"): (5.69, 5.27, 5.06),
    ("qwen3-14b", "placement"): (0.038, 0.037, 0.036),
    ("qwen3-14b", "resource_manager"): (5.05, 4.99, 4.97),
    ("qwen3-32b", "placement"): (0.037, 0.038, 0.036),
    ("qwen3-32b", "resource_manager"): (5.06, 5.01, 4.98),
}
# The speedups §7.1-7.4 state, as ranges over the workloads (and models, for Fig. 12): Heddle
# over each baseline (Fig. 12), PPS over the other schedulers (Fig. 14), Heddle's placement
# over least-load and cache-aware (Fig. 15)
SPEEDUP_PAPER = {
    "fig12": {"verl": (1.4, 2.3), "verl_star": (1.1, 2.4), "slime": (1.2, 2.5)},
    "fig14": {"fcfs": (1.1, 1.26), "rr": (1.1, 1.26), "sjf": (1.1, 1.26)},
    "fig15": {"least_load": (1.2, 1.5), "cache_aware": (1.2, 1.5)},
}


def _paper_ms(model: str, policy: str, kind: WorkloadKind) -> float | None:
    stated = TABLE2_PAPER.get((model, policy))
    return None if stated is None else 1e3 * stated[WORKLOADS.index(kind)]


def table2_tasks(
    cells: Callable[[WorkloadKind, str], Scenario], models: tuple[str, ...], repeats: int
) -> Iterator[Task]:
    """Decision time of the placement DP and of the annealing resource manager (Table 2)."""
    for model in models:
        for kind in WORKLOADS:

            def run(kind: WorkloadKind = kind, model: str = model) -> list[Record]:
                scn = cells(kind, model)
                lengths = scn.initial_lengths
                layout = scn.heddle_layout()
                costs = [scn.cost(d) for d in layout.degrees]
                allowed = tuple(d for d in (1, 2, 4, 8) if scn.cost.feasible(d))
                place = _median_ms(lambda: presorted_dp_hetero(lengths, costs), repeats)
                manage = _median_ms(
                    lambda: anneal_allocation(
                        lengths, scn.scale.gpus, scn.cost, degrees=allowed, seed=scn.seed
                    ),
                    repeats,
                )
                common = {
                    "experiment": "table2",
                    "workload": kind.value,
                    "model": model,
                    "trajectories": len(lengths),
                    "gpus": scn.scale.gpus,
                }
                return [
                    {
                        **common,
                        "policy": "placement",
                        "workers": len(costs),
                        "decision_ms": place,
                        "paper_decision_ms": _paper_ms(model, "placement", kind),
                    },
                    {
                        **common,
                        "policy": "resource_manager",
                        "workers": len(costs),
                        "decision_ms": manage,
                        "paper_decision_ms": _paper_ms(model, "resource_manager", kind),
                    },
                ]

            yield f"table2 {model} {kind.value}", run


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def run_experiments(
    seed: int, quick: bool, *, models: tuple[str, ...] = MODELS
) -> tuple[int, Iterator[Task]]:
    """All of §7's experiments as tasks: (count, iterator of (label, thunk))."""
    scale = HeddleScale.for_run(quick)
    cache: dict[tuple[WorkloadKind, str], Scenario] = {}

    def cells(kind: WorkloadKind, model: str) -> Scenario:
        if (kind, model) not in cache:
            cache[(kind, model)] = Scenario(kind=kind, model=model, scale=scale, seed=seed)
        return cache[(kind, model)]

    groups = [
        list(fig12_tasks(cells, models)),
        list(fig13_tasks(scale, seed)),
        list(fig14_tasks(cells)),
        list(fig15_tasks(cells)),
        list(fig16_tasks(cells)),
        list(table2_tasks(cells, models, repeats=3 if quick else 7)),
    ]
    tasks = [t for g in groups for t in g]
    return len(tasks), iter(tasks)


THROUGHPUT = "rollout throughput (tokens/s)"


def plot(records: list[Record], out: Path) -> list[Path]:
    """Fig. 12-16 and Table 2 as PNG bar charts under `out`; Heddle's speedups beside the
    ranges the paper states (Fig. 12, 14, 15) and Table 2's times as black markers."""
    by = by_experiment(records)
    paths = []
    if "fig12" in by:
        paths.append(
            bar_plot(
                by["fig12"],
                x="workload",
                hue="policy",
                metric="throughput_tok_s",
                facet="model",
                ylabel=THROUGHPUT,
                path=out / "fig12.png",
                title="Fig. 12: rollout throughput",
            )
        )
    if "fig13" in by:
        for metric, ylabel in (
            ("recall", "recall (fraction)"),
            ("pearson", "Pearson r (coefficient)"),
        ):
            paths.append(
                bar_plot(
                    by["fig13"],
                    x="workload",
                    hue="policy",
                    metric=metric,
                    ylabel=ylabel,
                    path=out / f"fig13_{metric}.png",
                    title=f"Fig. 13: prediction {metric}",
                )
            )
    if "fig14" in by:
        for metric, ylabel in (
            ("rollout_time_s", "rollout time (s)"),
            ("longest_queue_delay_s", "longest queueing delay (s)"),
        ):
            paths.append(
                bar_plot(
                    by["fig14"],
                    x="workload",
                    hue="policy",
                    metric=metric,
                    ylabel=ylabel,
                    path=out / f"fig14_{metric}.png",
                    title=f"Fig. 14: scheduling, {metric.removesuffix('_s').replace('_', ' ')}",
                )
            )
    for exp, title in (("fig15", "placement"), ("fig16", "resource manager")):
        if exp in by:
            paths.append(
                bar_plot(
                    by[exp],
                    x="workload",
                    hue="policy",
                    metric="throughput_tok_s",
                    ylabel=THROUGHPUT,
                    path=out / f"{exp}.png",
                    title=f"Fig. {exp[3:]}: {title}, throughput",
                )
            )
    if "table2" in by:
        paths.append(
            bar_plot(
                by["table2"],
                x="workload",
                hue="policy",
                metric="decision_ms",
                paper="paper_decision_ms",  # Table 2, TABLE2_PAPER
                facet="model",
                ylabel="decision time (ms)",
                path=out / "table2.png",
                title="Table 2: decision time",
            )
        )
    paths += _speedup_plots(records, out)
    return paths


def _speedup_plots(records: list[Record], out: Path) -> list[Path]:
    """Heddle's (or PPS's) speedup over each baseline, from `summary`'s rows, beside the
    range the paper states for it (SPEEDUP_PAPER)."""
    paths = []
    for exp, stated in SPEEDUP_PAPER.items():
        rows = [
            {
                "workload": f"{r['workload']} {r['model'].removeprefix('qwen3-')}"
                if exp == "fig12"
                else r["workload"],
                "over": base,
                "speedup": r[f"vs_{base}"],
                "paper_speedup": span,
            }
            for r in records
            if r["experiment"] == "summary"
            and (r.get("ablation") == exp or (exp == "fig12" and "ablation" not in r))
            and r["policy"] in ("heddle", "pps")
            for base, span in stated.items()
            if f"vs_{base}" in r
        ]
        if rows:
            who = "PPS" if exp == "fig14" else "Heddle"
            paths.append(
                bar_plot(
                    rows,
                    x="workload",
                    hue="over",
                    metric="speedup",
                    paper="paper_speedup",  # §7.1-7.3, ranges as stated
                    label=lambda b: f"over {b}",
                    ylabel=f"{who}'s speedup (×)",
                    path=out / f"{exp}_speedup.png",
                    title=f"Fig. {exp[3:]}: {who}'s speedup, the paper's range beside it",
                )
            )
    return paths


def summary(records: list[Record]) -> list[Record]:
    """Headline ratios: Heddle over the best baseline (Fig. 12), PPS over FCFS, RR and SJF
    (Fig. 14), Heddle's placement over least-load and cache-aware (Fig. 15)."""
    rows: list[Record] = []
    f12 = [r for r in records if r["experiment"] == "fig12"]
    for model in dict.fromkeys(r["model"] for r in f12):
        for kind in WORKLOADS:
            cell = {
                r["policy"]: r["throughput_tok_s"]
                for r in f12
                if r["model"] == model and r["workload"] == kind.value
            }
            if "heddle" not in cell:
                continue
            best = max(v for k, v in cell.items() if k != "heddle")
            rows.append(
                {
                    "experiment": "summary",
                    "workload": kind.value,
                    "model": model,
                    "policy": "heddle",
                    "vs_best_baseline": cell["heddle"] / best,
                    "vs_verl": cell["heddle"] / cell["verl"],
                    "vs_slime": cell["heddle"] / cell["slime"],
                    "vs_verl_star": cell["heddle"] / cell["verl_star"],
                }
            )
    rows += _ratio_rows(
        records,
        "fig14",
        ("pps",),
        tuple(k.value for k in SCHEDULER_ABLATION if k != SchedulerKind.PPS),
    )
    rows += _ratio_rows(
        records, "fig15", ("heddle", "heddle" + EXTENSION), ("least_load", "cache_aware")
    )
    return rows


def _ratio_rows(
    records: list[Record], exp: str, policies: tuple[str, ...], others: tuple[str, ...]
) -> list[Record]:
    """Per workload: each of `policies` against each of `others`, as a speedup in rollout time
    (other's time / its time; above 1: it is faster), with the slowest and the fastest other."""
    rows: list[Record] = []
    recs = [r for r in records if r["experiment"] == exp]
    for kind in WORKLOADS:
        cell = {r["policy"]: r["rollout_time_s"] for r in recs if r["workload"] == kind.value}
        theirs = {k: cell[k] for k in others if k in cell}
        for policy in policies:
            if policy not in cell or not theirs:
                continue
            ours = cell[policy]
            rows.append(
                {
                    "experiment": "summary",
                    "workload": kind.value,
                    "model": ABLATION_MODEL,
                    "policy": policy,
                    "ablation": exp,
                    "speedup_vs_slowest_other": max(theirs.values()) / ours,
                    "speedup_vs_fastest_other": min(theirs.values()) / ours,
                    **{f"vs_{k}": v / ours for k, v in theirs.items()},
                }
            )
    return rows
