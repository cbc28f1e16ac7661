"""`loom plan rollout`: Heddle's annealed model-parallel layout (§6) for a GPU budget, planned
from a history of finished trajectories with a per-degree cost from measured engine profiles
(or, without profiles, the roofline latency model).

The batch planned for is the history's latest `batch` trajectories (all of it where not
given), as the progressive predictor sees them at batch declaration: its k=0 predictions
(prompt features only), fitted on the whole history. RL rollouts revisit their prompts epoch
after epoch, so the next batch looks like the last one, and planning on predicted rather than
actual lengths sizes the workers for the groups the runtime's placement will form from the
same predictions. (Planning for several epochs at once would size every group several times
too large, and favour many small workers.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from loom.core.errors import ConfigError
from loom.core.topology import GpuType
from loom.core.trajectory import TrajectorySpec
from loom.perf.specs import gpu_spec, model_spec
from loom.rollout.heddle.planner import AnnealingPlanner, CostModel, DegreeCostModel, decode_context
from loom.rollout.heddle.predictor import ProgressivePredictor
from loom.rollout.heddle.resource_manager import (
    Allocation,
    Unsplittable,
    homogeneous_allocation,
)
from loom.runtime.rollout.cost import ProfiledDegreeCost

__all__ = ["PlanSettings", "RolloutPlan", "WorkerPlan", "plan_rollout", "plan_table"]


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """What to plan for and with; `profiles` replace the roofline `model` on `gpu`."""

    gpus: int = field(metadata={"help": "GPU budget"})
    degrees: tuple[int, ...] = field(default=(1, 2, 4, 8), metadata={"help": "TP degrees"})
    profiles: tuple[Path, ...] = field(default=(), metadata={"help": "engine profile CSVs"})
    model: str = field(default="qwen3-14b", metadata={"help": "roofline model key"})
    gpu: str = field(default="h100", metadata={"help": "roofline GPU type"})
    max_running: int = field(default=256, metadata={"help": "turns an engine runs at once"})
    gpus_per_node: int = field(default=8, metadata={"help": "GPUs per node, for device ids"})
    seed: int = field(default=0, metadata={"help": "seed of the annealing"})
    simulate: bool = field(
        default=False,
        metadata={
            "help": "check the annealed layout against the uniform ones by serving the "
            "batch on each in the simulator (the router's core under heddle and pps, on the "
            "roofline of model on gpu), and keep the fastest"
        },
    )
    batch: int | None = field(
        default=None,
        metadata={
            "help": "plan for the history's latest BATCH trajectories (one batch); "
            "default: all of them"
        },
    )

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.max_running < 1 or self.gpus_per_node < 1:
            raise ConfigError("gpus, max_running and gpus_per_node must be >= 1")
        if self.batch is not None and self.batch < 1:
            raise ConfigError(f"batch must be >= 1, got {self.batch}")
        if self.simulate and self.profiles:
            raise ConfigError(
                "simulate serves the batch on the roofline of model on gpu, not on profiles"
            )
        if not self.degrees or min(self.degrees) < 1:
            raise ConfigError(f"degrees must be >= 1, got {self.degrees}")


@dataclass(frozen=True, kw_only=True)
class WorkerPlan:
    """One worker (engine) of the layout and the share of the batch planned onto it."""

    worker: int
    tp: int
    gpus: tuple[int, ...] = field(metadata={"help": "global GPU indices, node-major"})
    gpus_per_node: int
    trajectories: int = field(metadata={"help": "trajectories the placement gives it"})
    longest_tokens: float = field(metadata={"help": "its longest predicted trajectory"})
    predicted_s: float = field(metadata={"help": "Formula 2 time of its group"})
    share: float = field(metadata={"help": "predicted_s over the makespan (1: the bottleneck)"})

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted({g // self.gpus_per_node for g in self.gpus}))

    def port(self, base: int = 8001) -> int:
        return base + self.worker

    def command(self, single_node: bool = True) -> str:
        """A vLLM launch line for this worker (SGLang: `--tp`), with the node to run it on
        unless the whole layout fits one."""
        serve = f"vllm serve MODEL --tensor-parallel-size {self.tp} --port {self.port()}"
        if len(self.nodes) > 1:
            return f"{serve}  # spans nodes {', '.join(map(str, self.nodes))}"
        devices = ",".join(str(g % self.gpus_per_node) for g in self.gpus)
        where = "" if single_node else f"  # on node{self.nodes[0]}"
        return f"CUDA_VISIBLE_DEVICES={devices} {serve}{where}"

    def url(self, single_node: bool) -> str:
        host = "127.0.0.1" if single_node else f"node{self.nodes[0]}"
        return f"http://{host}:{self.port()}"


@dataclass(frozen=True, kw_only=True)
class RolloutPlan:
    """The annealed layout and the placement of the planned batch on it."""

    gpus: int
    cost: str = field(metadata={"help": "which cost model planned it"})
    trajectories: int
    context_per_seq: int = field(metadata={"help": "mean decode context of the history"})
    makespan_s: float = field(metadata={"help": "Formula 2 makespan of the placement"})
    workers: tuple[WorkerPlan, ...]
    annealed: tuple[int, ...] = field(default=(), metadata={"help": "the annealer's layout"})
    simulated: tuple[tuple[tuple[int, ...], float], ...] = field(
        default=(), metadata={"help": "each layout simulated, and its makespan"}
    )

    @property
    def degrees(self) -> tuple[int, ...]:
        return tuple(w.tp for w in self.workers)

    @property
    def single_node(self) -> bool:
        return all(w.nodes == (0,) for w in self.workers)

    def engines(self) -> list[dict[str, Any]]:
        """The workers as `loom serve rollout`'s config lists its engines."""
        return [{"url": w.url(self.single_node), "tp": w.tp} for w in self.workers]

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "degrees": list(self.degrees),
            "makespan_s": self.makespan_s,
            "trajectories": self.trajectories,
            "context_per_seq": self.context_per_seq,
            "cost": self.cost,
            "workers": [
                {
                    "worker": w.worker,
                    "tp": w.tp,
                    "gpus": list(w.gpus),
                    "nodes": list(w.nodes),
                    "trajectories": w.trajectories,
                    "longest_tokens": w.longest_tokens,
                    "predicted_s": w.predicted_s,
                    "share": w.share,
                    "command": w.command(self.single_node),
                }
                for w in self.workers
            ],
            "engines": self.engines(),
            "annealed": list(self.annealed),
            "simulated": [{"degrees": list(d), "makespan_s": m} for d, m in self.simulated],
        }


def plan_rollout(history: Sequence[TrajectorySpec], settings: PlanSettings) -> RolloutPlan:
    """Fit the predictor on `history`, build the cost model and anneal the layout."""
    if not history:
        raise ConfigError("the history holds no trajectories; planning needs finished ones")
    batch = list(history[-settings.batch :]) if settings.batch else list(history)
    cost, name = _cost_model(batch, settings)
    allowed = tuple(d for d in sorted(set(settings.degrees)) if cost.feasible(d))
    if not allowed:
        raise ConfigError(_infeasible(cost, batch, settings))
    lengths = predicted_lengths(history)[-len(batch) :]
    planner = AnnealingPlanner(cost=cost, degrees=allowed, seed=settings.seed)
    try:
        alloc = planner.allocate(lengths, settings.gpus)
    except Unsplittable:
        raise ConfigError(
            f"{settings.gpus} GPUs cannot be split into workers of the usable degrees {allowed}"
        ) from None
    annealed = alloc.degrees
    simulated: tuple[tuple[tuple[int, ...], float], ...] = ()
    if settings.simulate:
        alloc, simulated = _by_simulation(alloc, batch, history, lengths, cost, allowed, settings)
    return RolloutPlan(
        gpus=settings.gpus,
        cost=name,
        annealed=annealed,
        simulated=simulated,
        trajectories=len(batch),
        context_per_seq=decode_context(batch),
        makespan_s=alloc.makespan,
        workers=_workers(alloc, lengths, settings.gpus_per_node),
    )


def _by_simulation(
    alloc: Allocation,
    batch: Sequence[TrajectorySpec],
    history: Sequence[TrajectorySpec],
    lengths: Sequence[float],
    cost: CostModel,
    allowed: tuple[int, ...],
    settings: PlanSettings,
) -> tuple[Allocation, tuple[tuple[tuple[int, ...], float], ...]]:
    """The annealed allocation or a uniform one, whichever serves `batch` fastest in the
    simulator (NOTE: Formula 2 has a group share its worker for its longest trajectory's whole
    time, which overrates small workers where the group's short trajectories end early)."""
    from loom.sim.rollout.layouts import Fleet, renumbered, served_on

    n = settings.gpus
    candidates = [alloc.degrees]
    candidates += [
        (d,) * (n // d) for d in allowed if n % d == 0 and (d,) * (n // d) != alloc.degrees
    ]
    specs = renumbered(batch)
    predictions = ProgressivePredictor().fit(history).predict_steps(specs)
    fleet = Fleet(
        model=model_spec(settings.model).name,
        gpu=GpuType(gpu_spec(settings.gpu).gpu),
        gpus=n,
        gpus_per_node=settings.gpus_per_node,
        max_running=settings.max_running,
    )
    spans = {
        d: served_on(specs, d, fleet, predictions=predictions, history=history).makespan_s
        for d in candidates
    }
    best = min(candidates, key=lambda d: spans[d])  # (ties: the annealed one)
    if best != alloc.degrees:
        alloc = homogeneous_allocation(lengths, n, cost, best[0])
    return alloc, tuple(spans.items())


def predicted_lengths(history: Sequence[TrajectorySpec]) -> list[float]:
    """The progressive predictor's k=0 totals for the history, in order, fitted on it."""
    return [row[0] for row in ProgressivePredictor().fit(history).predict_steps(history)]


def _cost_model(history: Sequence[TrajectorySpec], settings: PlanSettings) -> tuple[CostModel, str]:
    """The cost model and its description; a worker must hold the longest trajectory."""
    shape = {
        "context_per_seq": decode_context(history),
        "max_group": len(history),
        "max_running": settings.max_running,
        "min_kv_tokens": _longest_context(history),
    }
    if settings.profiles:
        profiled = ProfiledDegreeCost.load(settings.profiles, **shape)
        return profiled, f"profiled tp {', '.join(map(str, profiled.degrees))}"
    model, gpu = model_spec(settings.model).name, GpuType(gpu_spec(settings.gpu).gpu)
    return DegreeCostModel(gpu=gpu, model=model, **shape), f"roofline {model} on {gpu.value}"


def _longest_context(history: Sequence[TrajectorySpec]) -> int:
    return max(s.total_tokens for s in history)


def _infeasible(cost: CostModel, history: Sequence[TrajectorySpec], settings: PlanSettings) -> str:
    need = f"{_longest_context(history):,} tokens of KV cache (the history's longest trajectory)"
    if isinstance(cost, ProfiledDegreeCost):
        held = ", ".join(
            f"tp={d} holds {cost.profiles[d].kv_capacity_tokens:,}" for d in cost.degrees
        )
        return f"no degree in {settings.degrees} is profiled and holds {need}; {held}"
    return f"no degree in {settings.degrees} of {settings.model} on {settings.gpu} holds {need}"


def _workers(alloc: Allocation, lengths: Sequence[float], per_node: int) -> tuple[WorkerPlan, ...]:
    workers = []
    first = 0
    makespan = alloc.makespan
    for j, (tp, group) in enumerate(zip(alloc.degrees, alloc.placement.groups, strict=True)):
        t = alloc.placement.group_makespans[j]
        workers.append(
            WorkerPlan(
                worker=j,
                tp=tp,
                gpus=tuple(range(first, first + tp)),
                gpus_per_node=per_node,
                trajectories=len(group),
                longest_tokens=max((lengths[i] for i in group), default=0.0),
                predicted_s=t,
                share=t / makespan if makespan > 0 else 0.0,
            )
        )
        first += tp
    return tuple(workers)


def plan_table(plan: RolloutPlan) -> Table:
    """The layout as a table, one row per worker."""
    layout = "+".join(map(str, plan.degrees))
    table = Table(
        title=f"Heddle layout for {plan.gpus} GPUs: {layout}",
        caption=f"predicted makespan {plan.makespan_s:,.1f} s for {plan.trajectories} "
        f"trajectories like the history's; share: a worker's predicted time over it; "
        f"cost: {plan.cost}" + _simulated(plan),
    )
    for name in ("worker", "tp", "GPUs", "trajectories", "longest tokens", "predicted s"):
        table.add_column(name, justify="right")
    table.add_column("share", justify="right")
    for w in plan.workers:
        table.add_row(
            str(w.worker),
            str(w.tp),
            _ranges(w.gpus),
            str(w.trajectories),
            f"{w.longest_tokens:,.0f}",
            f"{w.predicted_s:,.1f}",
            f"{w.share:.2f}",
        )
    return table


def _simulated(plan: RolloutPlan) -> str:
    if not plan.simulated:
        return ""
    served = ", ".join(f"{'+'.join(map(str, d))} {m:,.0f} s" for d, m in plan.simulated)
    return f"; served in the simulator: {served} (annealed: {'+'.join(map(str, plan.annealed))})"


def _ranges(gpus: Sequence[int]) -> str:
    return str(gpus[0]) if len(gpus) == 1 else f"{gpus[0]}-{gpus[-1]}"
