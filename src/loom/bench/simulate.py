"""A benchmark's batch in Loom's simulator: the same trajectories under the same system's
router, run by the router's own core (`loom.sim.rollout.served`) in front of the emulated
engines' state on simulated time, the router's predictor fitted on the same history, the
engines timed by their measured profile (`simulate`) or by the emulated GPU's roofline
(`simulate_emulated`), set as the benchmark set the real ones (`loom.bench.settings`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from loom.bench.batch import Batch, BatchConfig, history_specs, to_spec
from loom.bench.settings import RouterSetup, simulated_engines, simulated_router

if TYPE_CHECKING:
    from loom.perf.latency import LatencyModel
    from loom.runtime.emulate.config import EmulatedEngineConfig
    from loom.sim.rollout.served import ServedResult

__all__ = ["simulate", "simulate_emulated"]


def _run(
    config: BatchConfig,
    setup: RouterSetup,
    policies: tuple[str, str],
    batch: Batch,
    engines: list[EmulatedEngineConfig],
    *,
    latency: Callable[[int], LatencyModel] | None = None,
    dispatch_s: float = 0.0,
    decision_s: float = 0.0,
) -> ServedResult:
    """`batch` on `engines` behind the router of `setup` under `policies`."""
    from loom.rollout.heddle.predictor import ProgressivePredictor
    from loom.runtime.rollout.config import RolloutServerConfig
    from loom.runtime.rollout.core import RouterCore
    from loom.runtime.rollout.policies import make_core
    from loom.sim.rollout.served import ServedRollout

    specs = [to_spec(s, t) for s, t in batch]
    history = history_specs(config)
    predictions = ProgressivePredictor().fit(history).predict_steps(specs) if history else None

    def core(settings: RolloutServerConfig) -> RouterCore:
        return make_core(settings, history=history)  # Heddle plans with the history's contexts

    return ServedRollout(
        specs,
        engines,
        simulated_router(setup, *policies, len(engines)),
        predictions=predictions,
        latency=latency,
        dispatch_s=dispatch_s,
        decision_s=decision_s,
        core=core,
    ).run()


def simulate(
    config: BatchConfig,
    setup: RouterSetup,
    policies: tuple[str, str],
    batch: Batch,
    n_engines: int,
    profile: Path,
) -> float:
    """The makespan of `batch` in the simulator, its `n_engines` engines timed by the
    measured `profile` (the vLLM CPU engine's, as served), each running the router's cap at
    once and reserving as much KV per request as a turn may generate (`max_turn_tokens`)."""
    from loom.perf.latency import ProfiledLatencyModel

    served = replace(setup, profiles=(profile,))
    latency = ProfiledLatencyModel.load(profile)
    engines = simulated_engines(served, n_engines, decode_reserve=config.max_turn_tokens)
    return _run(config, served, policies, batch, engines, latency=lambda tp: latency).makespan_s


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
) -> ServedResult:
    """The same batch on the engines the emulated servers run (the roofline of the emulated
    GPU of `setup`, each engine running up to `engine_max_running` requests), behind the
    router's core under the system's `policies`. `dispatch_s`: GPU seconds from a turn being
    ready to the router (the HTTP round trips); `decision_s`: the router's GPU seconds per
    turn, one turn at a time."""
    if setup.model is None:
        raise ValueError("simulate_emulated needs the emulated GPU's model (RouterSetup.model)")
    engines = simulated_engines(setup, n_engines, max_running=engine_max_running)
    return _run(
        config, setup, policies, batch, engines, dispatch_s=dispatch_s, decision_s=decision_s
    )
