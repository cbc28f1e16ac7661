"""ROSE's evaluation (§6, App. A–E) as runs of registered policies on the co-serving simulator.

Every system sees the same seeded trajectories per step and the same seeded serving day. The
RL step loop is one-step off-policy (§6): the rollout of step s starts when the rollout of step
s−1 has ended and the weights of step s−2 are trained; a lent instance serves the rollout only
once those weights have crossed to it (Fig. 10's sparse transfer), while dedicated workers
start at once. AReaL streams: a fixed number of trajectories stay alive and training takes
each batch as it completes. Throughput is the trained sequences' tokens per step over the time
between step ends (§6, "Metrics").

Baselines as the paper defines them: ROLL (the job's own GPUs; each environment pinned to one
inference worker — ROLL's agentic scheduler keeps an environment on its worker), AReaL (fully
asynchronous on the same GPUs); variants of ROSE for the ablations (static partition, no
prefix cache, TTFT-only / TPOT-only / no admission, pinned or turn-wise routing, lease times,
serving density, fewer lent GPUs).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from loom.core.errors import ConfigError
from loom.core.topology import GpuType
from loom.core.trajectory import TrajectorySpec
from loom.experiments.report import Record, Task, bar_plot, by_experiment, line_plot
from loom.perf.latency import RooflineLatencyModel
from loom.perf.specs import gpu_spec, model_spec
from loom.rollout.rose.admission import AdmissionKind, Role, ServingSlo
from loom.rollout.rose.memory import PAGE_BYTES, MemoryConfig, MemorySharing
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

__all__ = ["Algo", "RoseSystem", "TrainRun", "plot", "run_experiments", "summary", "train"]

GPU = GpuType.H800  # §6: H800 clusters
PREFILL_EVERY = 4  # §6: prefill-to-decoding instance ratio 1:3
HEADROOM_FRACTION = 0.2  # §4.1: H, e.g. 20% of GPU memory
MEMORY_FRACTION = 0.9  # of HBM for weights + KV (the engines' usual gpu_memory_utilization)


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
    """P: a lent GPU's pages after both models' weight shards; H: 20% of its memory."""
    g = gpu_spec(GPU)
    hbm = g.hbm_gb * 1e9
    weights = (model_spec(rollout_model).weight_bytes + model_spec(serving_model).weight_bytes) / tp
    pool = int((hbm * MEMORY_FRACTION - weights) // PAGE_BYTES)
    if pool <= 0:
        raise ConfigError(f"{rollout_model} and {serving_model} do not fit on TP{tp} of {GPU}")
    return MemoryConfig(
        pool_pages=pool,
        headroom_pages=int(HEADROOM_FRACTION * hbm // PAGE_BYTES),
        lease_s=lease_s,
    )


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


# ---- experiments --------------------------------------------------------------------------
PAPER = {  # the paper's headline figures, beside ours in `summary`
    ("fig7", "8b", "grpo"): 1.31,
    ("fig7", "32b", "grpo"): 1.46,
    ("fig7", "8b", "dapo"): 1.42,
    ("fig7", "32b", "dapo"): 3.31,
    ("fig7", "8b", "areal"): 1.44,
    ("fig7", "32b", "areal"): 2.69,
    ("fig14", "8b", 4): 1.26,
    ("fig14", "8b", 8): 1.45,
    ("fig14", "8b", 16): 1.69,
    ("table3", "8b", "turn_wise"): 1.11,
    ("table3", "32b", "turn_wise"): 1.08,
    ("table3", "8b", "rose"): 1.16,
    ("table3", "32b", "rose"): 1.48,
}


@dataclass(frozen=True, kw_only=True)
class RoseScale:
    """Steps per run: the paper trains 25-100 steps; the simulator averages fewer."""

    steps: int
    dapo_steps: int  # DAPO's steps each run several rollouts' worth
    analysis_steps: int  # §6.2-6.4 and the appendices run five steps
    models: tuple[str, ...] = ("8b", "32b")

    @classmethod
    def for_run(cls, quick: bool) -> RoseScale:
        if quick:
            return cls(steps=3, dapo_steps=2, analysis_steps=2)
        return cls(steps=10, dapo_steps=6, analysis_steps=5)


def _wl(key: str) -> RoseWorkload:
    from loom.sim.workloads.rose import ROSE_WORKLOADS

    return ROSE_WORKLOADS[key]


def _serving_records(run: TrainRun, wl: RoseWorkload) -> Record:
    ttft, tpot = run.serving()
    out: Record = {"serving_requests": len(ttft)}
    for name, xs, slo in (("ttft", ttft, wl.slo_ttft_s), ("tpot", tpot, wl.slo_tpot_s)):
        if len(xs):
            out[f"{name}_p95_ms"] = float(np.percentile(xs, 95) * 1e3)
            out[f"{name}_p99_ms"] = float(np.percentile(xs, 99) * 1e3)
            out[f"{name}_over_slo"] = float(np.mean(xs > slo))
            out[f"{name}_violations"] = int(np.sum(xs > slo))
            out[f"{name}_slo_met"] = bool(np.percentile(xs, 99) <= slo)
    # NOTE: a request's TTFT is measured at its prefiller and its TPOT at its decoder; a
    # request over both SLOs counts twice here.
    out["slo_violations"] = out.get("ttft_violations", 0) + out.get("tpot_violations", 0)
    results = [s.result for s in run.steps]
    out["stalls"] = sum(r.stalls for r in results)
    out["aborts"] = sum(r.aborts for r in results)
    out["cuts"] = sum(r.cuts for r in results)
    return out


def _row(experiment: str, key: str, run: TrainRun, **extra: object) -> Record:
    wl = _wl(key)
    return {
        "experiment": experiment,
        "model": wl.model,
        "policy": run.system,
        "algo": run.algo.value,
        "steps": len(run.steps),
        "throughput_tok_s": run.mean_throughput(),
        "rollout_time_s": float(np.mean([s.rollout_s for s in run.steps])),
        "step_time_s": float(np.mean(run.step_times)),
        **extra,
    }


def fig7_tasks(scale: RoseScale, seed: int) -> Iterator[Task]:
    """Fig. 7a-c: ROSE against ROLL-GRPO, ROLL-DAPO and AReaL."""
    for key in scale.models:
        for algo, base in (
            (Algo.GRPO, "roll_grpo"),
            (Algo.DAPO, "roll_dapo"),
            (Algo.AREAL, "areal"),
        ):

            def thunk(key: str = key, algo: Algo = algo, base: str = base) -> list[Record]:
                wl = _wl(key)
                steps = scale.dapo_steps if algo == Algo.DAPO else scale.steps
                rose = train(wl, ROSE, Algo.GRPO if algo == Algo.AREAL else algo, steps, seed)
                other = train(wl, replace(ROLL, name=base), algo, steps, seed)
                ratio = rose.mean_throughput() / other.mean_throughput()
                rows = []
                for run in (rose, other):
                    rows.append(
                        _row("fig7", key, run, baseline=base, speedup=ratio if run is rose else 1.0)
                    )
                rows[0]["paper_speedup"] = PAPER[("fig7", key, algo.value)]
                return rows

            yield f"fig7 {key} {algo.value}", thunk


FIG8_PAPER = {  # §6.1: rollout speedup over ROLL; preempted GPU time (Fig. 8b)
    ("8b", "lambda_rl"): (1.31, 0.261),
    ("32b", "lambda_rl"): (1.23, 0.261),
    ("8b", "rlboost_plus"): (1.41, 0.068),
    ("32b", "rlboost_plus"): (1.48, 0.073),
    ("8b", "rose"): (1.41 * 1.20, 0.005),
    ("32b", "rose"): (1.48 * 1.26, 0.005),
}


def fig8_tasks(scale: RoseScale, seed: int) -> Iterator[Task]:
    """Fig. 8: rollout time and preempted GPU time of ROLL, λRL, RLBoost+ and ROSE (GRPO),
    over the volatile spot window."""
    systems = (
        replace(ROLL, name="roll"),
        replace(ROLL, name="lambda_rl", elastic="serverless"),
        replace(ROLL, name="rlboost_plus", elastic="spot"),
        ROSE,
    )
    for key in scale.models:

        def thunk(key: str = key) -> list[Record]:
            wl = _wl(key)
            runs = [train(wl, system, Algo.GRPO, scale.steps, seed) for system in systems]
            base = float(np.mean([s.rollout_s for s in runs[0].steps]))
            rows = []
            for run in runs:
                t = float(np.mean([s.rollout_s for s in run.steps]))
                paper = FIG8_PAPER.get((key, run.system), (1.0, 0.0))
                rows.append(
                    _row(
                        "fig8",
                        key,
                        run,
                        speedup=base / t,
                        paper_speedup=paper[0],
                        preempted_gpu_frac=run.preempted_gpu_s / run.gpu_s,
                        paper_preempted_gpu_frac=paper[1],
                    )
                )
            return rows

        yield f"fig8 {key}", thunk


FIG14_TIMELINE_S = 5.0  # the first step's timeline, a point every 5 s of simulated time
FIG14_SERIES = (
    "trajectories alive",
    "turns in the central queue",
    "turns on dedicated GPUs",
    "turns on lent GPUs",
)


def longest_alone_s(wl: RoseWorkload, specs: Sequence[TrajectorySpec]) -> float:
    """The step's slowest trajectory run alone on one dedicated rollout worker (its turns, its
    tool calls, nothing batched beside it): no placement over any number of GPUs ends the step
    sooner."""
    route = ROSE_ROUTERS.get(RoutingKind.ROSE)
    dedicated = [wl.rollout_tp]
    return max(
        _simulation(wl, [s], router=route(), dedicated_tp=dedicated).run().makespan_s for s in specs
    )


def fig14_tasks(scale: RoseScale, seed: int) -> Iterator[Task]:
    """App. E / Fig. 14: rollout time of Qwen3-8B with 0, 4, 8 and 16 lent GPUs; beside it
    the most any lent GPUs could give (the steps' slowest trajectories alone), and the first
    step's timeline with none and with 16."""

    def thunk() -> list[Record]:
        wl = _wl("8b")
        seeded = replace(wl, seed=seed)
        steps = training_steps(seeded, Algo.GRPO, scale.analysis_steps)
        alone = float(np.mean([longest_alone_s(seeded, seeded.sample(at)) for at in steps]))
        base = None
        rows: list[Record] = []
        for n in (0, 4, 8, 16):
            run = train(
                wl,
                replace(ROSE, name=f"rose+{n}", lent_gpus=n),
                Algo.GRPO,
                scale.analysis_steps,
                seed,
                timeline_s=FIG14_TIMELINE_S if n in (0, 16) else None,
            )
            t = float(np.mean([s.rollout_s for s in run.steps]))
            base = base or t
            rows.append(
                _row(
                    "fig14",
                    "8b",
                    run,
                    lent_gpus=n,
                    speedup=base / t,
                    paper_speedup=PAPER.get(("fig14", "8b", n), 1.0),
                    longest_alone_s=alone,
                    speedup_bound=base / alone,
                )
            )
            rows += [
                {
                    "experiment": "fig14_timeline",
                    "model": wl.model,
                    "lent_gpus": n,
                    "panel": f"{n} lent GPUs",
                    "t_s": point[0],
                    "series": name,
                    "count": count,
                }
                for point in run.steps[0].result.timeline
                for name, count in zip(FIG14_SERIES, point[1:], strict=True)
            ]
        return rows

    yield "fig14", thunk


def table3_tasks(scale: RoseScale, seed: int) -> Iterator[Task]:
    """Table 3: pinned trajectories, then turn-wise routing, then KV-cache affinity."""
    for key in scale.models:

        def thunk(key: str = key) -> list[Record]:
            wl = _wl(key)
            rows, base = [], None
            for kind in (RoutingKind.PIN, RoutingKind.TURN_WISE, RoutingKind.ROSE):
                system = replace(ROSE, name=kind.value, routing=kind)
                run = train(wl, system, Algo.GRPO, scale.analysis_steps, seed)
                t = float(np.mean([s.rollout_s for s in run.steps]))
                base = base or t
                rows.append(
                    _row(
                        "table3",
                        key,
                        run,
                        speedup=base / t,
                        paper_speedup=PAPER.get(("table3", key, kind.value), 1.0),
                    )
                )
            return rows

        yield f"table3 {key}", thunk


PAPER_COSERVE_KEYS = ("paper_rollout_time_s", "paper_ttft_p99_ms", "paper_tpot_p99_ms")
# The paper's rollout time (s), P99 TTFT (ms) and P99 TPOT (ms) per (experiment, model, variant),
# as its Tables 2 (§6.2), 4 (App. C) and 5 (App. D) state them
COSERVE_PAPER: dict[tuple[str, str, str], tuple[float, float, float]] = {
    ("table2", "8b", "static_partition"): (776.7, 330.95, 1488.2),
    ("table2", "8b", "+memory_preemption"): (591.7, 517.9, 162.8),
    ("table2", "8b", "+prefix_caching"): (469.3, 333.6, 186.3),
    ("table2", "32b", "static_partition"): (1310.5, 603.0, 7021.1),
    ("table2", "32b", "+memory_preemption"): (959.7, 651.3, 503.8),
    ("table2", "32b", "+prefix_caching"): (920.4, 640.6, 483.2),
    ("table4", "8b", "lease_10s"): (496.3, 338.11, 136.13),
    ("table4", "8b", "lease_20s"): (497.1, 334.71, 135.28),
    ("table4", "8b", "lease_50s"): (492.2, 371.10, 140.70),
    ("table4", "8b", "lease_100s"): (502.1, 491.90, 148.10),
    ("table5", "8b", "density_1"): (496.3, 338.1, 136.1),
    ("table5", "8b", "density_1.5"): (511.7, 380.2, 149.0),
    ("table5", "8b", "density_2"): (569.9, 459.1, 150.1),
    ("table5", "32b", "density_1"): (960.1, 837.5, 398.1),
    ("table5", "32b", "density_1.5"): (977.7, 870.2, 421.3),
    ("table5", "32b", "density_2"): (989.9, 899.1, 441.2),
}


def _coserve_tasks(
    experiment: str,
    scale: RoseScale,
    seed: int,
    variants: Sequence[tuple[str, RoseSystem]],
    suffix: str = "",
    **tags: object,
) -> Iterator[Task]:
    for key in scale.models:

        def thunk(key: str = key) -> list[Record]:
            wl = _wl(key)
            rows = []
            for label, system in variants:
                run = train(wl, replace(system, name=label), Algo.GRPO, scale.analysis_steps, seed)
                rows.append(_row(experiment, key, run, **_serving_records(run, wl), **tags))
                paper = COSERVE_PAPER.get((experiment, key, label))
                if paper is not None:
                    rows[-1].update(zip(PAPER_COSERVE_KEYS, paper, strict=True))
                for k, v in _variant_fields(system).items():
                    rows[-1].setdefault(k, v)
            return rows

        yield f"{experiment} {key}{suffix}", thunk


# Table 1 (§6.2): rollout time (s) and the P99 serving latency (ms) of each method
TABLE1_PAPER = {
    ("8b", "rose"): (496.3, 338.1),
    ("8b", "serverlessllm"): (651.7, 1166.1),
    ("8b", "prism"): (731.7, 973.2),
    ("8b", "serving_alone"): (None, 314.8),
    ("32b", "rose"): (960.1, 837.5),
    ("32b", "serverlessllm"): (1161.8, 2426.2),
    ("32b", "prism"): (1301.2, 1625.4),
    ("32b", "serving_alone"): (None, 716.1),
}


def table1_tasks(scale: RoseScale, seed: int) -> Iterator[Task]:
    """Table 1: rollout time and serving P99 of ROSE, ServerlessLLM (swapping the models) and
    Prism, beside the lent GPUs serving alone (ServerlessLLM without rollouts); each rollout
    time also over ROSE's, as the paper's text compares them."""
    for label, thunk in _coserve_tasks("table1", scale, seed, TABLE1):

        def with_alone(label: str = label, thunk=thunk) -> list[Record]:  # type: ignore[no-untyped-def]
            rows = thunk()
            key = label.split()[1]
            wl = _wl(key)
            rose_s = next(r["rollout_time_s"] for r in rows if r["policy"] == "rose")
            for r in rows:
                paper_s, paper_p99 = TABLE1_PAPER.get((key, r["policy"]), (None, None))
                r["paper_rollout_time_s"], r["paper_p99_ms"] = paper_s, paper_p99
                r["rollout_vs_rose"] = r["rollout_time_s"] / rose_s
                rose_paper = TABLE1_PAPER[(key, "rose")][0]
                r["paper_rollout_vs_rose"] = (
                    paper_s / rose_paper if paper_s and rose_paper else None
                )
            day = _serving_day(wl, ROSE, seed)
            assert day is not None
            res = serving_alone(wl, wl.max_lent_gpus, day)
            run = TrainRun(system="serving_alone", algo=Algo.GRPO)
            run.steps.append(StepOut(0, 0.0, 1.0, 0, res))
            row = {"experiment": "table1", "model": wl.model, "policy": "serving_alone"}
            paper_p99 = TABLE1_PAPER[(key, "serving_alone")][1]
            rows.append({**row, **_serving_records(run, wl), "paper_p99_ms": paper_p99})
            return rows

        yield label, with_alone


def _variant_fields(system: RoseSystem) -> Record:
    return {
        "admission": system.admission.value,
        "lease_s": system.lease_s,
        "density": system.density,
        "preemptive": system.preemptive,
        "prefix_cache": system.prefix_cache,
    }


TABLE2 = (
    ("static_partition", replace(ROSE, preemptive=False, prefix_cache=False)),
    ("+memory_preemption", replace(ROSE, prefix_cache=False)),
    ("+prefix_caching", ROSE),
)
FIG9 = tuple(
    (kind.value, replace(ROSE, admission=kind))
    for kind in (
        AdmissionKind.DUAL_SLO,
        AdmissionKind.TTFT_ONLY,
        AdmissionKind.TPOT_ONLY,
        AdmissionKind.NONE,
    )
)
# Fig. 9 again under three times the serving density, where ROSE's admission still holds
# every request within its SLO and no admission does not (the serving load of Fig. 3b leaves
# both within it: see the README).
STRESS_DENSITY = 3.0
FIG9_STRESS = tuple(
    (f"{label}@x{STRESS_DENSITY:g}", replace(system, density=STRESS_DENSITY))
    for label, system in FIG9
    if label in ("dual_slo", "none")
)
TABLE4 = tuple((f"lease_{int(x)}s", replace(ROSE, lease_s=x)) for x in (10.0, 20.0, 50.0, 100.0))
TABLE5 = tuple((f"density_{x:g}", replace(ROSE, density=x)) for x in (1.0, 1.5, 2.0))
# Table 1's GPU-multiplexing baseline (Prism, §6.1): co-scheduled without dual-SLO admission
# and without a rollout prefix cache. NOTE: Prism schedules the rollout at 4x the serving SLO;
# without its scheduler, no admission at all is the nearest registered policy.
TABLE1 = (
    ("rose", ROSE),
    # §6.2: ServerlessLLM in place of the co-serving executor (bidirectional autoscaling)
    ("serverlessllm", replace(ROSE, swap=True, admission=AdmissionKind.NONE)),
    # its keep-alive is not given: also scaled down the moment serving idles
    (
        "serverlessllm@keepalive0",
        replace(ROSE, swap=True, admission=AdmissionKind.NONE, keep_alive_s=0.0),
    ),
    ("prism", replace(ROSE, admission=AdmissionKind.NONE, prefix_cache=False)),
)


def fig12_tasks(seed: int) -> Iterator[Task]:
    """App. A / Fig. 12: rollout throughput of one Qwen3-8B GPU against its running cap."""

    def thunk() -> list[Record]:
        wl = _wl("8b")
        specs = wl.sample(0, n_groups=8)
        rows = []
        for cap in (1, 2, 4, 8, 16, 32, 64):
            res = _simulation(
                wl,
                specs,
                router=ROSE_ROUTERS.get(RoutingKind.ROSE)(cap_per_gpu=cap),
                dedicated_tp=[1],
                cap_per_gpu=cap,
            ).run()
            rows.append(
                {
                    "experiment": "fig12",
                    "model": wl.model,
                    "policy": "dedicated",
                    "per_gpu_batch": cap,
                    "throughput_tok_s": (res.output_tokens + res.prefill_tokens) / res.makespan_s,
                    "output_tok_s": res.output_tokens / res.makespan_s,
                    "rollout_time_s": res.makespan_s,
                }
            )
        return rows

    yield "fig12", thunk


def run_experiments(seed: int, quick: bool) -> tuple[int, Iterator[Task]]:
    scale = RoseScale.for_run(quick)
    from loom.experiments.rose_transfer import fig10_records

    groups: list[list[Task]] = [
        list(fig7_tasks(scale, seed)),
        list(fig8_tasks(scale, seed)),
        list(fig14_tasks(scale, seed)),
        list(table3_tasks(scale, seed)),
        list(table1_tasks(scale, seed)),
        list(_coserve_tasks("table2", scale, seed, TABLE2)),
        list(_coserve_tasks("fig9", scale, seed, FIG9)),
        list(
            _coserve_tasks("fig9", replace(scale, models=("32b",)), seed, FIG9_STRESS, suffix=" x3")
        ),
        list(_coserve_tasks("table4", replace(scale, models=("8b",)), seed, TABLE4)),
        list(_coserve_tasks("table5", scale, seed, TABLE5)),
        list(fig12_tasks(seed)),
        [("fig10", lambda: fig10_records(seed, quick))],
    ]
    tasks = [t for g in groups for t in g]
    return len(tasks), iter(tasks)


ROLLOUT_S, TTFT, TPOT = "rollout time (s)", "P99 TTFT (ms)", "P99 TPOT (ms)"
# One bar chart each: experiment, file, x, hue, metric, the paper's (None: it states none),
# y label, title. The paper's values come from the records (PAPER, FIG8_PAPER, TABLE1_PAPER,
# COSERVE_PAPER and rose_transfer's tables), each cited where it is defined.
BARS: tuple[tuple[str, str, str, str, str, str | None, str, str], ...] = (
    (
        "fig7",
        "fig7",
        "baseline",
        "policy",
        "throughput_tok_s",
        None,
        "throughput (tokens/s)",
        "Fig. 7: throughput",
    ),
    (
        "fig7",
        "fig7_speedup",
        "baseline",
        "policy",
        "speedup",
        "paper_speedup",
        "ROSE's speedup (×)",
        "Fig. 7: ROSE's speedup",
    ),
    ("fig8", "fig8", "policy", "model", "rollout_time_s", None, ROLLOUT_S, "Fig. 8a: rollout time"),
    (
        "fig8",
        "fig8_speedup",
        "policy",
        "model",
        "speedup",
        "paper_speedup",
        "rollout speedup over ROLL (×)",
        "Fig. 8a: speedup over ROLL",
    ),
    (
        "fig8",
        "fig8b",
        "policy",
        "model",
        "preempted_gpu_frac",
        "paper_preempted_gpu_frac",
        "preempted GPU time (fraction)",
        "Fig. 8b: allocation overhead",
    ),
    ("fig9", "fig9", "policy", "model", "tpot_p99_ms", None, TPOT, "Fig. 9: serving TPOT P99"),
    (
        "table1",
        "table1",
        "policy",
        "model",
        "rollout_time_s",
        "paper_rollout_time_s",
        ROLLOUT_S,
        "Table 1: rollout time",
    ),
    (
        "table1",
        "table1_ttft",
        "policy",
        "model",
        "ttft_p99_ms",
        "paper_p99_ms",
        TTFT,
        "Table 1: serving TTFT P99",
    ),
    (
        "table2",
        "table2",
        "policy",
        "model",
        "rollout_time_s",
        "paper_rollout_time_s",
        ROLLOUT_S,
        "Table 2: rollout time",
    ),
    (
        "table2",
        "table2_tpot",
        "policy",
        "model",
        "tpot_p99_ms",
        "paper_tpot_p99_ms",
        TPOT,
        "Table 2: serving TPOT P99",
    ),
    (
        "table3",
        "table3",
        "policy",
        "model",
        "speedup",
        "paper_speedup",
        "rollout speedup over pinned (×)",
        "Table 3: routing",
    ),
    (
        "table4",
        "table4",
        "policy",
        "model",
        "ttft_p99_ms",
        "paper_ttft_p99_ms",
        TTFT,
        "Table 4: serving TTFT P99 by lease",
    ),
    (
        "table5",
        "table5",
        "policy",
        "model",
        "ttft_p99_ms",
        "paper_ttft_p99_ms",
        TTFT,
        "Table 5: serving TTFT P99",
    ),
    (
        "table5",
        "table5_rollout",
        "policy",
        "model",
        "rollout_time_s",
        "paper_rollout_time_s",
        ROLLOUT_S,
        "Table 5: rollout time",
    ),
    (
        "fig10",
        "fig10",
        "policy",
        "model",
        "transfer_s",
        "paper_transfer_s",
        "weight transfer time (s)",
        "Fig. 10a: weight transfer",
    ),
)
# One line chart each: experiment, file, x, x label, metric, y label, hue, the paper's, title
LINES: tuple[tuple[str, str, str, str, str, str, str, str | None, str], ...] = (
    (
        "fig10b",
        "fig10b",
        "bandwidth_gbps",
        "bandwidth (Gbps)",
        "transfer_s",
        "weight transfer time (s)",
        "policy",
        "paper_transfer_s",
        "Fig. 10b: transfer vs bandwidth",
    ),
    (
        "fig12",
        "fig12",
        "per_gpu_batch",
        "per-GPU batch (requests)",
        "throughput_tok_s",
        "throughput (tokens/s)",
        "policy",
        None,
        "Fig. 12: per-GPU batch",
    ),
    (
        "fig14",
        "fig14",
        "lent_gpus",
        "lent serving GPUs (GPUs)",
        "rollout_time_s",
        ROLLOUT_S,
        "algo",
        None,
        "Fig. 14: rollout time vs lent GPUs",
    ),
    (
        "fig14",
        "fig14_speedup",
        "lent_gpus",
        "lent serving GPUs (GPUs)",
        "speedup",
        "speedup over no lent GPUs (×)",
        "algo",
        "paper_speedup",
        "Fig. 14: speedup vs lent GPUs",
    ),
)


def plot(records: list[Record], out: Path) -> list[Path]:
    """Fig. 7, 8, 9, 10, 12, 14 and Tables 1-5 as PNG charts under `out`, the paper's values
    as black markers (bars) or dashed lines (lines) wherever it states them."""
    by = by_experiment(records)
    paths = []
    for exp, stem, x, hue, metric, paper, ylabel, title in BARS:
        if exp in by:
            paths.append(
                bar_plot(
                    by[exp],
                    x=x,
                    hue=hue,
                    metric=metric,
                    paper=paper,
                    ylabel=ylabel,
                    facet="model",
                    path=out / f"{stem}.png",
                    title=title,
                )
            )
    if "fig14_timeline" in by:
        paths.append(
            line_plot(
                by["fig14_timeline"],
                x="t_s",
                metric="count",
                hue="series",
                facet="panel",
                xlabel="time into the step (s)",
                ylabel="trajectories, turns",
                path=out / "fig14_timeline.png",
                title="Fig. 14: the first 8B step with no lent GPUs and with 16",
            )
        )
    for exp, stem, x, xlabel, metric, ylabel, hue, paper, title in LINES:
        if exp in by:
            paths.append(
                line_plot(
                    by[exp],
                    x=x,
                    metric=metric,
                    hue=hue,
                    facet="model",
                    paper=paper,
                    xlabel=xlabel,
                    ylabel=ylabel,
                    path=out / f"{stem}.png",
                    title=title,
                )
            )
    return paths


def summary(records: list[Record]) -> list[Record]:
    """Ours beside the paper's: speedups of Fig. 7, Fig. 14, Table 3 and Fig. 10, Table 1's
    rollout times over ROSE's; whether
    ROSE met the serving SLOs and `none` did not."""
    rows: list[Record] = []
    for r in records:
        if r.get("paper_speedup") is not None and r["experiment"] in ("fig7", "fig14", "table3"):
            if r["experiment"] == "fig7" and r["policy"] != "rose":
                continue
            rows.append(
                {
                    "experiment": "summary",
                    "of": r["experiment"],
                    "model": r["model"],
                    "policy": r["policy"],
                    "variant": r.get("baseline")
                    if r["experiment"] == "fig7"
                    else r.get("lent_gpus", r["policy"]),
                    "speedup": r["speedup"],
                    "paper": r["paper_speedup"],
                    "within_15pct": abs(r["speedup"] / r["paper_speedup"] - 1) <= 0.15,
                }
            )
    for r in records:
        if r["experiment"] == "table1" and r.get("paper_rollout_vs_rose") and r["policy"] != "rose":
            rows.append(
                {
                    "experiment": "summary",
                    "of": "table1",
                    "model": r["model"],
                    "policy": r["policy"],
                    "variant": "rollout time over ROSE's",
                    "speedup": r["rollout_vs_rose"],
                    "paper": r["paper_rollout_vs_rose"],
                    "within_15pct": abs(r["rollout_vs_rose"] / r["paper_rollout_vs_rose"] - 1)
                    <= 0.15,
                }
            )
    for r in records:
        if r["experiment"] == "fig10" and r.get("paper_speedup"):
            rows.append(
                {
                    "experiment": "summary",
                    "of": "fig10",
                    "model": r["model"],
                    "policy": r["policy"],
                    "variant": r["policy"],
                    "speedup": r["speedup_vs_batch"],
                    "paper": r["paper_speedup"],
                    "within_15pct": abs(r["speedup_vs_batch"] / r["paper_speedup"] - 1) <= 0.15,
                }
            )
    for r in records:
        if r["experiment"] == "fig9" and r["policy"].split("@")[0] in ("dual_slo", "none"):
            rows.append(
                {
                    "experiment": "summary",
                    "of": "fig9",
                    "model": r["model"],
                    "policy": r["policy"],
                    "variant": f"density {r['density']:g}: requests over SLO",
                    "speedup": float(r.get("ttft_violations", 0) + r.get("tpot_violations", 0)),
                    "paper": 0.0 if r["policy"].startswith("dual_slo") else None,
                    "within_15pct": None,
                }
            )
    return rows
