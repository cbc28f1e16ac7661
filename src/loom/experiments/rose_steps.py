"""ROSE's RL step loop on the co-serving simulator (§6): the systems compared, the cluster
they run on (lent serving instances, their memory and serving day, the elastic baselines'
pools) and `train`, a run of RL steps, one-step off-policy (GRPO, DAPO) or streaming (AReaL).
The experiments that run it, and their plots, are `loom.experiments.rose`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cache
from typing import Any

import numpy as np

from loom.core.errors import ConfigError
from loom.core.topology import GpuType
from loom.core.trajectory import TrajectorySpec
from loom.perf.latency import RooflineLatencyModel
from loom.perf.specs import model_spec
from loom.rollout.rose.admission import AdmissionKind, Role, ServingSlo
from loom.rollout.rose.memory import MemoryConfig, MemorySharing, lent_memory
from loom.rollout.rose.scheduler import ROSE_ROUTERS, RoutingKind
from loom.rollout.rose.selection import ACTIVATION_S
from loom.sim.rollout.coserve import CoServeConfig, SwapConfig
from loom.sim.rollout.rose import (
    ElasticPool,
    LentInstance,
    RoseRollout,
    RoseRolloutResult,
    _Feed,
)
from loom.sim.rollout.state import TrajState
from loom.sim.workloads.rose import (
    Algorithm,
    RoseWorkload,
    serverless_lease,
    spot_trace,
    train_time_s,
)
from loom.sim.workloads.serving import (
    PAPER_SM_UTILISATION,
    Azure2023,
    ServingTrace,
    azure_2023,
    synthetic_day,
)

__all__ = ["Algo", "RoseSystem", "TrainRun", "train"]

GPU = GpuType.H800  # §6: H800 clusters
PREFILL_EVERY = 4  # §6: prefill-to-decoding instance ratio 1:3


class Algo(StrEnum):
    GRPO = "grpo"
    DAPO = "dapo"
    AREAL = "areal"


@dataclass(frozen=True, kw_only=True)
class RoseSystem:
    """One rollout system: how many serving GPUs it borrows and how it co-serves."""

    name: str
    lent_gpus: int = 0  # -1: the workload's cap
    routing: RoutingKind = RoutingKind.ROSE
    admission: AdmissionKind = AdmissionKind.DUAL_SLO
    preemptive: bool = True
    prefix_cache: bool = True
    lease_s: float = 10.0
    density: float = 1.0
    elastic: str | None = None  # "spot" (RLBoost+) or "serverless" (λRL): extra rollout GPUs
    swap: bool = False  # ServerlessLLM: swap the two models instead of co-serving them
    keep_alive_s: float | None = None  # its keep-alive (None: the serving model's load time)


ROLL = RoseSystem(name="roll", routing=RoutingKind.PIN)
ROSE = RoseSystem(name="rose", lent_gpus=-1)


@dataclass
class StepOut:
    step: int
    rollout_s: float
    train_end_s: float
    tokens: int
    result: RoseRolloutResult


@dataclass
class TrainRun:
    system: str
    algo: Algo
    steps: list[StepOut] = field(default_factory=list)
    gpu_s: float = 0.0  # GPU-seconds held: the job's own, lent and elastic
    preempted_gpu_s: float = 0.0  # GPUs preempted (or activated) x their recovery

    @property
    def step_times(self) -> np.ndarray:
        ends = np.array([0.0] + [s.train_end_s for s in self.steps])
        return np.diff(ends)

    @property
    def throughput(self) -> np.ndarray:
        return np.array([s.tokens for s in self.steps]) / self.step_times

    def mean_throughput(self) -> float:
        return float(sum(s.tokens for s in self.steps) / self.steps[-1].train_end_s)

    def serving(self) -> tuple[np.ndarray, np.ndarray]:
        ttft = np.concatenate([s.result.ttft_s for s in self.steps] or [np.zeros(0)])
        tpot = np.concatenate([s.result.tpot_s for s in self.steps] or [np.zeros(0)])
        return ttft, tpot


# ---- the cluster --------------------------------------------------------------------------
def _memory(rollout_model: str, serving_model: str, tp: int, lease_s: float) -> MemoryConfig:
    """A lent instance's memory on the experiments' H800s (`lent_memory`)."""
    return lent_memory(GPU, rollout_model, serving_model, tp, lease_s)


def load_s(model: str, tp: int) -> float:
    """Seconds to load `model`'s weights onto a TP-`tp` instance from host memory, at the rate
    of ROSE's own activation (§4.1: Qwen3-32B, on the TP-4 instances of its 32B workload,
    within 5 s): per-GPU bytes over that bandwidth."""
    per_gpu_bw = model_spec("qwen3-32b").weight_bytes / 4 / ACTIVATION_S
    return model_spec(model).weight_bytes / tp / per_gpu_bw


def lent_instances(wl: RoseWorkload, system: RoseSystem) -> list[LentInstance]:
    """The serving instances `system` borrows (1 prefiller : 3 decoders), each with its own
    memory policy kept across steps."""
    gpus = wl.max_lent_gpus if system.lent_gpus < 0 else system.lent_gpus
    tp = wl.rollout_tp
    mem = _memory(wl.model, wl.serving_model, tp, system.lease_s if system.prefix_cache else 0.0)
    slo = ServingSlo(ttft_s=wl.slo_ttft_s, tpot_s=wl.slo_tpot_s)
    swap = None
    if system.swap:
        swap = SwapConfig(
            serving_load_s=load_s(wl.serving_model, tp),
            rollout_load_s=load_s(wl.model, tp),
            keep_alive_s=system.keep_alive_s,
        )
    out = []
    for i in range(gpus // tp):
        cfg = CoServeConfig(
            role=Role.PREFILL if i % PREFILL_EVERY == 0 else Role.DECODE,
            slo=slo,
            admission=system.admission,
            memory=mem,
            preemptive=system.preemptive,
            prefix_cache=system.prefix_cache,
            swap=swap,
        )
        out.append(LentInstance(config=cfg, memory=MemorySharing(mem), tp=tp))
    return out


# ---- the step loop ------------------------------------------------------------------------
def _simulation(wl: RoseWorkload, specs: Sequence[TrajectorySpec], **kwargs: Any) -> RoseRollout:
    """A `RoseRollout` of `wl`'s models on H800s (roofline latency, their KV sizes)."""
    return RoseRollout(
        specs,
        rollout_latency=lambda tp: RooflineLatencyModel(GPU, wl.model, tp=tp),
        serving_latency=lambda tp: RooflineLatencyModel(GPU, wl.serving_model, tp=tp),
        rollout_kv_bytes=model_spec(wl.model).kv_bytes_per_token,
        serving_kv_bytes=model_spec(wl.serving_model).kv_bytes_per_token,
        **kwargs,
    )


def _rollout(
    wl: RoseWorkload,
    system: RoseSystem,
    specs: Sequence[TrajectorySpec],
    *,
    lent: list[LentInstance],
    serving: ServingTrace | None,
    serving_offset_s: float,
    start_s: float,
    step: int,
    weights_delay_s: float,
    feed: _Feed | None,
    elastic: ElasticPool | None = None,
    timeline_s: float | None = None,
) -> RoseRolloutResult:
    return _simulation(
        wl,
        specs,
        router=ROSE_ROUTERS.get(system.routing)(),
        dedicated_tp=[wl.rollout_tp] * (wl.rollout_gpus // wl.rollout_tp),
        lent=lent,
        serving=serving,
        serving_offset_s=serving_offset_s,
        start_s=start_s,
        step=step,
        weights_delay_s=weights_delay_s,
        feed=feed,
        elastic=elastic,
        timeline_s=timeline_s,
    ).run()


SERVING_ALONE_WINDOW_S = 1800.0  # Table 1's serving-alone row: half an hour at 10:00
DAY_OFFSET_S = 10 * 3600.0  # the runs start at 10:00 of the synthetic day


def serving_alone(wl: RoseWorkload, lent_gpus: int, trace: ServingTrace) -> RoseRolloutResult:
    """`lent_gpus` lent GPUs serving `trace` alone (no rollout) for half an hour at 10:00:
    Table 1's ServerlessLLM-without-rollout row, the serving latency every variant adds to."""
    return _simulation(
        wl,
        (),
        router=ROSE_ROUTERS.get(RoutingKind.ROSE)(),
        dedicated_tp=(),
        lent=lent_instances(wl, replace(ROSE, lent_gpus=lent_gpus)),
        serving=trace,
        serving_offset_s=DAY_OFFSET_S,
        serving_horizon_s=SERVING_ALONE_WINDOW_S,
    ).run()


def serving_rate(wl: RoseWorkload, lent_gpus: int) -> float:
    """Mean requests/s of the lent slice's share of the serving day at density 1. NOTE: the
    rate keeps the slice's prefillers busy 18.9% of the time on average (Fig. 3b's mean SM
    utilisation): under PD disaggregation the prefillers do the compute-bound work that SM
    utilisation measures. Fitting the rate to Table 1's serving-alone TTFT P99 (314.8 ms)
    instead would treat all of that latency as queueing: the prefillers would run at ~55% and
    saturate at 1.5x density, where Table 5 shows the paper's serving still within its SLO."""
    instances = lent_gpus // wl.rollout_tp
    prefillers = -(-instances // PREFILL_EVERY)
    if prefillers == 0:
        return 0.0
    return PAPER_SM_UTILISATION * prefillers / _mean_prefill_s(wl.serving_model, wl.rollout_tp)


@cache
def _mean_prefill_s(serving_model: str, tp: int) -> float:
    """Mean prefill time of the conversation trace's prompts on the serving model."""
    lat = RooflineLatencyModel(GPU, serving_model, tp=tp)
    prompts = azure_2023(Azure2023.CONV).prompt_tokens
    return float(np.mean([lat.prefill_time(max(1, int(p))) for p in prompts[:5000]]))


@cache
def _day(rps: float, density: float, seed: int) -> ServingTrace:
    """The synthetic serving day (read-only arrays): built once per rate, density and seed."""
    return synthetic_day(mean_rps=rps, hours=24.0, density=density, seed=seed)


def _serving_day(wl: RoseWorkload, system: RoseSystem, seed: int) -> ServingTrace | None:
    """The lent slice's share of the serving day, at `serving_rate` × the density (Table 5)."""
    gpus = wl.max_lent_gpus if system.lent_gpus < 0 else system.lent_gpus
    rps = serving_rate(wl, gpus)
    if rps <= 0:
        return None
    return _day(rps, system.density, seed)


def transfer_s(wl: RoseWorkload) -> float:
    """Seconds for a step's weights to reach the lent instances (Fig. 10's sparse transfer)."""
    from loom.experiments.rose_transfer import transfer_time_s

    return transfer_time_s(wl.model, "sparse")


def training_steps(wl: RoseWorkload, algo: Algo, steps: int) -> list[int]:
    """Which of the paper's training steps (§6: GRPO 100/40, DAPO 50/25) a run of `steps`
    simulates: spread evenly over training, so that DAPO's share of valid groups, which
    drifts as the model learns, is sampled from start to end."""
    total = wl.steps[Algorithm.DAPO if algo == Algo.DAPO else Algorithm.GRPO]
    if steps < 1:
        raise ConfigError(f"steps must be >= 1, got {steps}")
    return sorted({round(x) for x in np.linspace(0, total - 1, min(steps, total))})


def train(
    wl: RoseWorkload,
    system: RoseSystem,
    algo: Algo,
    steps: int,
    seed: int,
    *,
    day_offset_s: float = DAY_OFFSET_S,
    timeline_s: float | None = None,
) -> TrainRun:
    """Run `steps` RL steps of `wl` under `system` with `algo` (GRPO and DAPO one-step
    off-policy, AReaL streaming) and return each step's times and tokens (and, every
    `timeline_s`, what each GRPO or DAPO step's rollout was doing: `RoseRolloutResult.timeline`)."""
    wl = replace(wl, seed=seed)
    if algo == Algo.AREAL:
        return _areal(wl, system, steps, seed)
    lent = lent_instances(wl, system)
    serving = _serving_day(wl, system, seed)
    pool = elastic_pool(wl, system, seed)
    run = TrainRun(system=system.name, algo=algo)
    delay = transfer_s(wl) if lent else 0.0
    rollout_end, train_end = 0.0, [0.0, 0.0]  # the ends of training steps s-2 and s-1
    p_valid = DAPO_FIRST_VALID
    previous = -1  # the training step simulated last
    for s, at in enumerate(training_steps(wl, algo, steps)):
        start = max(rollout_end, train_end[0])
        feed = None
        specs = wl.sample(at)
        if algo == Algo.DAPO:
            if s > 0 and previous != at - 1:
                # NOTE: the runs sample steps spread over training, so the step before this
                # one was not simulated: §6's "based on the previous step" then reads the
                # workload's own share of valid groups there, not a far earlier step's
                p_valid = max(1.0 / DAPO_MAX_MULTIPLE, wl.dapo.validity_prob(at - 1, wl.seed))
            feed = _dapo_feed(wl, at, p_valid)
            specs = list(feed.specs)
        previous = at
        res = _rollout(
            wl,
            system,
            specs,
            lent=lent,
            serving=serving,
            serving_offset_s=day_offset_s,
            start_s=start,
            step=s,
            weights_delay_s=max(0.0, train_end[0] + delay - start),
            feed=feed,
            elastic=pool,
            timeline_s=timeline_s,
        )
        if algo == Algo.DAPO:  # the share of valid groups among those that finished
            assert feed is not None and feed.stats is not None
            seen = max(1, feed.stats["finished"])
            p_valid = max(1.0 / DAPO_MAX_MULTIPLE, feed.stats["valid"] / seen)
        rollout_end = start + res.makespan_s
        done = max(rollout_end, train_end[1]) + train_time_s(wl, res.kept_tokens)
        train_end = [train_end[1], done]
        run.steps.append(StepOut(s, res.makespan_s, done, res.kept_tokens, res))
    end = run.steps[-1].train_end_s
    lent_gpus = sum(inst.tp for inst in lent)
    run.gpu_s = (wl.rollout_gpus + wl.train_gpus + lent_gpus) * end
    run.preempted_gpu_s = lent_gpus * ACTIVATION_S  # ROSE activates each lent GPU once
    if pool is not None:
        pool.account_drops(end)
        run.gpu_s += pool.held_gpu_s
        run.preempted_gpu_s += pool.preempted_gpu_s
    return run


def elastic_pool(wl: RoseWorkload, system: RoseSystem, seed: int) -> ElasticPool | None:
    """The elastic baselines' extra rollout GPUs (§6.1): RLBoost+'s spot instances follow the
    seeded volatile 2-hour trace (App. B; its last value holds after it); λRL's serverless
    GPUs all expire every 15 minutes and are acquired again at once, each paying a cold start,
    and the turns they ran start over."""
    if system.elastic is None:
        return None
    key = next(k for k in ("8b", "32b") if _wl(k).model == wl.model)
    if system.elastic == "spot":
        trace = spot_trace(key, seed)
        return ElasticPool(changes=trace.steps, tp=wl.rollout_tp, recovery_s=trace.recovery.total_s)
    if system.elastic == "serverless":
        lease = serverless_lease(key)
        changes: list[tuple[float, int]] = [(0.0, lease.gpus)]
        for t in lease.expiries(ELASTIC_HORIZON_S):
            changes += [(t, 0), (t + 1e-6, lease.gpus)]
        return ElasticPool(
            changes=tuple(changes),
            tp=wl.rollout_tp,
            recovery_s=lease.cold_start.total_s,
            restart=True,
        )
    raise ConfigError(f"unknown elastic pool {system.elastic!r}; known: spot, serverless")


ELASTIC_HORIZON_S = 48 * 3600.0  # λRL's leases are renewed for as long as a run lasts


DAPO_MAX_MULTIPLE = 6  # Fig. 1d: up to 5.7x the batch is generated
DAPO_FIRST_VALID = 0.5  # assumed: the share of valid groups expected before any step ran


def _dapo_feed(wl: RoseWorkload, step: int, p_valid: float) -> _Feed:
    """DAPO's redundant sampling (§6): launch enough groups for the batch at last step's
    share of valid groups (§6: "based on the previous step"), and launch another whenever a
    group finishes without reward variance while the valid and running groups fall short;
    the step ends when the batch's number of valid groups have finished."""
    need = wl.batch // wl.group
    most = DAPO_MAX_MULTIPLE * need
    specs = wl.sample(step, n_groups=most)
    valid = wl.dapo_valid(step, np.arange(most))
    done_in_group: dict[int, int] = {}
    state = {"valid": 0, "finished": 0, "launched": min(most, math.ceil(need / p_valid))}

    def refill(r: RoseRollout, t: TrajState) -> int:
        g = t.spec.prompt_id
        done_in_group[g] = done_in_group.get(g, 0) + 1
        if done_in_group[g] < wl.group:
            return 0
        state["finished"] += 1
        state["valid"] += bool(valid[g])
        running = state["launched"] - state["finished"]
        more = max(0, min(most - state["launched"], need - state["valid"] - running))
        state["launched"] += more
        return more * wl.group

    return _Feed(
        specs,
        state["launched"] * wl.group,
        stats=state,
        refill=refill,
        done=lambda r: state["valid"] >= need,
        keep=lambda t: (
            bool(valid[t.spec.prompt_id]) and done_in_group[t.spec.prompt_id] == wl.group
        ),
    )


def _areal(wl: RoseWorkload, system: RoseSystem, steps: int, seed: int) -> TrainRun:
    """AReaL, fully asynchronous: one stream keeps `batch` trajectories alive across steps
    (a new one starts whenever one finishes); step k's batch is the k-th `batch` to finish,
    and training takes it as soon as it is complete and the previous update is done."""
    specs: list[TrajectorySpec] = []
    ids = training_steps(wl, Algo.GRPO, steps)
    for at in [*ids, ids[-1] + 1]:  # one batch more keeps the stream full to the end
        specs += [replace(t, traj_id=len(specs) + i) for i, t in enumerate(wl.sample(at))]
    target = steps * wl.batch
    feed = _Feed(
        specs,
        wl.batch,
        refill=lambda r, t: 1,
        done=lambda r: r.finished >= target,
    )
    res = _rollout(
        wl,
        system,
        specs,
        lent=[],
        serving=None,
        serving_offset_s=0.0,
        start_s=0.0,
        step=0,
        weights_delay_s=0.0,
        feed=feed,
    )
    order = np.sort(res.finish_s)
    toks = res.kept_tokens_by_finish
    run = TrainRun(system=system.name, algo=Algo.AREAL)
    done = 0.0
    for k in range(steps):
        ready = float(order[(k + 1) * wl.batch - 1])
        tokens = int(sum(toks[k * wl.batch : (k + 1) * wl.batch]))
        done = max(ready, done) + train_time_s(wl, tokens)
        run.steps.append(StepOut(k, ready, done, tokens, res))
    return run


def _wl(key: str) -> RoseWorkload:
    from loom.sim.workloads.rose import ROSE_WORKLOADS

    return ROSE_WORKLOADS[key]
