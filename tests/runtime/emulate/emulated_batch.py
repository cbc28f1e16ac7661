"""A small agentic batch, the emulated engine's settings and the simulator's run of the batch
on one worker with the engine's own queue: what the emulated engine is compared with."""

from __future__ import annotations

import random

from loom.core.trajectory import TrajectorySpec, TurnSpec
from loom.rollout.baselines import CacheAwareRouter
from loom.rollout.engine_queue import EngineQueue, EngineSchedulingPolicy
from loom.rollout.policy import WorkerLayout
from loom.runtime.emulate import EmulatedEngineConfig, EmulationSpec
from loom.runtime.rollout.standin import next_token, token_logprob
from loom.sim.rollout.simulator import RolloutConfig, RolloutResult, RolloutSimulator


def batch(n: int, seed: int = 0, long: bool = False) -> list[TrajectorySpec]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        turns = []
        k = rng.randint(1, 4)
        for j in range(k):
            inp = rng.randint(16, 3000 if long else 600) if j == 0 else rng.randint(1, 400)
            tool = None if j == k - 1 else rng.uniform(0.05, 2.0)
            turns.append(TurnSpec(inp, rng.randint(1, 4000 if long else 900), tool))
        out.append(
            TrajectorySpec(traj_id=i, prompt_id=i, sample_idx=0, workload=None, turns=tuple(turns))
        )
    return out


def config(**kw: object) -> EmulatedEngineConfig:
    return EmulatedEngineConfig(
        spec=EmulationSpec.parse("qwen3-14b@h100:tp2"),
        scheduling_policy=EngineSchedulingPolicy.FCFS,
        **kw,  # type: ignore[arg-type]
    )


def simulate(specs: list[TrajectorySpec], cfg: EmulatedEngineConfig) -> RolloutResult:
    sim = RolloutSimulator(
        specs,
        WorkerLayout(degrees=(cfg.spec.tp,)),
        EngineQueue(policy=EngineSchedulingPolicy.FCFS),
        CacheAwareRouter(),
        RolloutConfig(
            model=cfg.spec.model,
            gpu=cfg.spec.gpu,
            max_running=cfg.max_running,
            chunk_tokens=cfg.chunk_tokens,
            decode_reserve=cfg.decode_reserve,
            requeue_in_place=True,
        ),
    )
    return sim.run()


def reference(prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """The stand-in model's greedy continuation of `prompt` and its logprobs (what every
    engine in these tests generates)."""
    ctx, toks, lps = list(prompt), [], []
    for _ in range(n):
        t = next_token(ctx)
        lps.append(token_logprob(ctx, t))
        toks.append(t)
        ctx.append(t)
    return toks, lps
