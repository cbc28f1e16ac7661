"""A benchmark's batch in Loom's rollout simulator: the same trajectories under the same
system's policies, the router's predictor fitted on the same history, the engines modelled by
their measured profile (`simulate`) or by the emulated GPU's roofline (`simulate_emulated`),
set as the benchmark set the real ones (`loom.bench.settings`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from loom.bench.batch import Batch, BatchConfig, history_specs, to_spec
from loom.bench.settings import RouterSetup, simulated_router, simulator_config

if TYPE_CHECKING:
    from loom.sim.rollout.simulator import LatencyFactory, RolloutConfig, RolloutResult

__all__ = ["simulate", "simulate_emulated"]


def _run(
    config: BatchConfig,
    setup: RouterSetup,
    policies: tuple[str, str],
    batch: Batch,
    n_engines: int,
    sim_config: RolloutConfig,
    latency: LatencyFactory | None = None,
) -> RolloutResult:
    """`batch` on `n_engines` simulated engines of `setup` under `policies`."""
    from loom.rollout.heddle.predictor import ProgressivePredictor
    from loom.rollout.policy import SCHEDULERS, WorkerLayout
    from loom.runtime.rollout.policies import make_router
    from loom.sim.rollout.simulator import RolloutSimulator

    specs = [to_spec(s, t) for s, t in batch]
    history = history_specs(config)
    predictions = ProgressivePredictor().fit(history).predict_steps(specs) if history else None
    settings = simulated_router(setup, *policies, n_engines)
    return RolloutSimulator(
        specs,
        WorkerLayout(degrees=(setup.tp,) * n_engines),
        SCHEDULERS.get(settings.scheduler)(),
        make_router(settings, history=history),
        sim_config,
        predictions=predictions,
        latency=latency,
    ).run()


def simulate(
    config: BatchConfig,
    setup: RouterSetup,
    policies: tuple[str, str],
    batch: Batch,
    n_engines: int,
    profile: Path,
) -> float:
    """The makespan of `batch` in the simulator, its `n_engines` engines modelled by the
    measured `profile` (the vLLM CPU engine's, as served), with the router's admission cap
    and as much KV reserved per turn as a turn may generate (`max_turn_tokens`). Migration
    recomputes the prefix there as it does here (no KV moves)."""
    from loom.perf.latency import ProfiledLatencyModel

    served = replace(setup, profiles=(profile,))
    latency = ProfiledLatencyModel.load(profile)
    result = _run(
        config,
        served,
        policies,
        batch,
        n_engines,
        simulator_config(served, decode_reserve=config.max_turn_tokens),
        lambda tp: latency,
    )
    return result.makespan_s


def simulate_emulated(
    config: BatchConfig,
    setup: RouterSetup,
    policies: tuple[str, str],
    batch: Batch,
    n_engines: int,
    *,
    engine_max_running: int,
    dispatch_s: float = 0.0,
    decision_s: float = 0.0,
) -> RolloutResult:
    """The same batch on the worker model the emulated engines run (the roofline of the
    emulated GPU of `setup`, each engine running up to `engine_max_running` turns), under the
    system's `policies` (placement, scheduler) inside the workers, as `loom reproduce heddle`
    runs them. KV caches do not move (the router cannot move them). `dispatch_s`: GPU seconds
    from a turn being ready to the router (the simulator's `dispatch_delay_s`: the HTTP round
    trips); `decision_s`: the router's GPU seconds per turn, one turn at a time
    (`router_decision_s`)."""
    if setup.model is None:
        raise ValueError("simulate_emulated needs the emulated GPU's model (RouterSetup.model)")
    return _run(
        config,
        setup,
        policies,
        batch,
        n_engines,
        simulator_config(
            setup,
            max_running=engine_max_running,
            dispatch_s=dispatch_s,
            decision_s=decision_s,
        ),
    )
