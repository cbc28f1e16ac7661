"""A batch served on an engine layout, in the simulator: the router's own core under a
system's placement and scheduler (`ServedRollout`) in front of one emulated engine per slot of
the layout (its degree, its node), on a model's roofline on a GPU type. What the planner asks
of a layout it considers, and what the layout benchmark runs for every system."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from loom.core.topology import GpuType
from loom.core.trajectory import TrajectorySpec
from loom.rollout.engine_queue import EngineSchedulingPolicy
from loom.rollout.policy import PlacementKind, SchedulerKind
from loom.runtime.emulate.config import EmulatedEngineConfig, EmulationSpec
from loom.runtime.rollout.config import EngineConfig, RolloutServerConfig
from loom.runtime.rollout.layout import slots
from loom.runtime.rollout.policies import make_core
from loom.sim.rollout.served import ServedResult, ServedRollout

__all__ = ["Fleet", "renumbered", "served_on"]


@dataclass(frozen=True, kw_only=True)
class Fleet:
    """Engines of `model` on `gpus` GPUs of `gpu` type, `gpus_per_node` a node, each running
    up to `max_running` turns; the router's cap per engine is the same."""

    model: str
    gpu: GpuType
    gpus: int
    gpus_per_node: int = 8
    max_running: int = 1024


def served_on(
    specs: Sequence[TrajectorySpec],
    degrees: Sequence[int],
    fleet: Fleet,
    *,
    placement: str = "heddle",
    scheduler: str = "pps",
    move_kv: bool = True,
    predictions: Sequence[Sequence[float]] | None = None,
    history: Sequence[TrajectorySpec] = (),
) -> ServedResult:
    """`specs` (ids 0..n-1) served on `degrees` under the system of `placement` and
    `scheduler`; `predictions[i][k]`: the router's predicted total of trajectory i after k
    turns; `history`: what Heddle's placement plans its cost with."""
    engines = [
        EmulatedEngineConfig(
            spec=EmulationSpec(model=fleet.model, gpu=fleet.gpu, tp=s.tp),
            node=s.node,
            max_running=fleet.max_running,
            scheduling_policy=EngineSchedulingPolicy.PRIORITY,
        )
        for s in slots(degrees, fleet.gpus, fleet.gpus_per_node)
    ]
    router = RolloutServerConfig(
        placement=PlacementKind(placement),
        scheduler=SchedulerKind(scheduler),
        model=fleet.model,
        gpu=fleet.gpu.value,
        move_kv=move_kv,
        engines=tuple(
            EngineConfig(url=f"http://sim{i}", max_running=fleet.max_running, tp=e.spec.tp)
            for i, e in enumerate(engines)
        ),
    )
    return ServedRollout(
        specs,
        engines,
        router,
        predictions=predictions,
        core=lambda c: make_core(c, history=history),
    ).run()


def renumbered(specs: Sequence[TrajectorySpec]) -> list[TrajectorySpec]:
    """`specs` with ids 0..n-1 in their order (a history's trajectories as a batch)."""
    return [replace(s, traj_id=i) for i, s in enumerate(specs)]
