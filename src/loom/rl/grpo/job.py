"""One GRPO job through Loom's three levels. Its policy trains as a deployment of the cluster
service; each step it

1. takes the shared engines with its weights at this step's version loaded (`SharedEngines`),
2. samples `samples` completions of every prompt through the rollout router (one trajectory
   each, its turns under `X-Trajectory-Id`, the engines' logprobs and weight version returned),
   the task's tool calls running in the action server's sandbox between turns,
3. scores them with the task's reward script in the sandbox and turns the rewards into
   group-normalised advantages,
4. trains: the trainer's logprobs of the samples checked against the engines', then PPO's
   clipped loss with the engines' logprobs as the sampling policy's (`minibatches` optimizer
   steps), and
5. publishes the new weights to its relay (`sync_weights`): the engines load them when the job
   next takes them.

Before the first step a supervised warm-up through the same service teaches the task's format.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from loom.client import ClusterClient, RolloutClient
from loom.client.cluster import DeploymentHandle
from loom.rl.grpo.advantages import group_advantages
from loom.rl.grpo.config import GRPOConfig, JobSpec
from loom.rl.grpo.pool import SharedEngines
from loom.rl.grpo.records import StepRecord
from loom.rl.grpo.tasks import Prompt, Task

__all__ = ["JobRun", "Sample"]


@dataclass
class Sample:
    """One trajectory: its tokens so far, which of them the policy generated, their logprobs
    under the engine that sampled them."""

    traj: str
    prompt: Prompt
    ids: list[int]
    generated: list[bool] = field(default_factory=list)  # per token after the first
    logprobs: list[float] = field(default_factory=list)  # per token after the first
    answer: list[int] = field(default_factory=list)  # the last turn's output
    versions: list[str] = field(default_factory=list)  # the weight version of each turn
    turns: int = 0
    tool: dict[str, int] | None = None  # a pending tool call

    def __post_init__(self) -> None:
        n = len(self.ids) - 1
        self.generated, self.logprobs = [False] * n, [0.0] * n

    def extend(self, tokens: Sequence[int], logprobs: Sequence[float] | None) -> None:
        self.ids += list(tokens)
        self.generated += [logprobs is not None] * len(tokens)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(tokens)


@dataclass
class JobRun:
    spec: JobSpec
    config: GRPOConfig
    task: Task
    model_dir: str
    cluster_url: str
    router_url: str
    actions_url: str
    relay_url: str
    engines: SharedEngines
    t0: float  # the run's start (perf_counter)
    on_step: Callable[[StepRecord], None] = lambda r: None
    records: list[StepRecord] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # warm-up, setup
    engines_ready: asyncio.Future[Any] | None = None

    async def run(self) -> list[StepRecord]:
        cfg, name = self.config, self.spec.name
        rng = random.Random(f"{cfg.seed}-{self.spec.seed}-{name}")
        async with (
            ClusterClient(self.cluster_url) as cluster,
            httpx.AsyncClient(base_url=self.actions_url, timeout=600, trust_env=False) as actions,
        ):
            t = time.perf_counter()
            job = await cluster.job(name)
            actor = await job.deployment(
                "actor",
                dp=cfg.services.dp,
                model=self.model_dir,
                seed=self.spec.seed,
                group=0,  # every job on one node group: the service multiplexes them
            )
            self.timings["deploy_s"] = time.perf_counter() - t
            try:
                t = time.perf_counter()
                await self._warmup(actor, rng)
                await _call(actor, "sync_weights", relay=self._relay(), version=0)
                self.timings["warmup_s"] = time.perf_counter() - t
                if self.engines_ready is not None:
                    t = time.perf_counter()
                    await self.engines_ready  # (they start while the jobs warm up)
                    self.timings["engines_wait_s"] = time.perf_counter() - t
                async with RolloutClient(self.router_url) as rollout:
                    for step in range(cfg.grpo.steps):
                        rec = await self._step(step, rng, actor, rollout, actions)
                        self.records.append(rec)
                        self.on_step(rec)
            finally:
                await job.delete()
        return self.records

    def _relay(self) -> dict[str, Any]:
        return {"url": self.relay_url, "job": self.spec.name}

    async def _warmup(self, actor: DeploymentHandle, rng: random.Random) -> None:
        g = self.config.grpo
        for _ in range(g.warmup_steps):
            rows = self.task.warmup(rng, g.warmup_batch)
            ids, mask = _pad([r for r, _ in rows], [m for _, m in rows], self.task.vocab.pad)
            await _call(actor, "forward_backward", ids=ids, mask=mask, loss="nll", agg="token")
            await _call(actor, "optim_step", lr=g.lr, max_grad_norm=g.max_grad_norm)

    # ---- one step ---------------------------------------------------------------------------

    async def _step(
        self,
        step: int,
        rng: random.Random,
        actor: DeploymentHandle,
        rollout: RolloutClient,
        actions: httpx.AsyncClient,
    ) -> StepRecord:
        name, g = self.spec.name, self.config.grpo
        start = time.perf_counter()
        phase: dict[str, float] = {}
        prompts = self.task.prompts(rng)
        samples = [
            Sample(f"{name}-s{step}-{p.id}-{i}", p, list(p.ids))
            for p in prompts
            for i in range(g.samples)
        ]
        async with self.engines.serving(name, self.relay_url, step) as held:
            phase["wait"] = held.waited_s
            phase["switch" if held.kind == "switch" else "sync"] = held.load_s
            t = time.perf_counter()
            await rollout.declare(
                [
                    {"id": s.traj, "prompt_id": f"{name}-{s.prompt.id}",
                     "prompt_tokens": len(s.ids)}
                    for s in samples
                ]
            )  # fmt: skip
            phase["rollout"] = time.perf_counter() - t
            tool_calls = 0
            for turn in range(self.task.turns):
                active = [s for s in samples if s.turns == turn and (turn == 0 or s.tool)]
                if not active:
                    break
                if turn:
                    t = time.perf_counter()
                    await self._tools(actions, active)
                    phase["tool"] = phase.get("tool", 0.0) + time.perf_counter() - t
                    tool_calls += len(active)
                t = time.perf_counter()
                await asyncio.gather(*(self._turn(rollout, s, step, turn) for s in active))
                phase["rollout"] = phase.get("rollout", 0.0) + time.perf_counter() - t
        t = time.perf_counter()
        await asyncio.gather(*(rollout.end(s.traj) for s in samples))  # (its lengths learned)
        phase["rollout"] = phase.get("rollout", 0.0) + time.perf_counter() - t
        t = time.perf_counter()
        rewards = await self._rewards(actions, samples)
        phase["reward"] = time.perf_counter() - t
        train = await self._train(actor, samples, rewards, step)
        phase["switch"] = phase.get("switch", 0.0) + train.pop("switch_s")
        phase["sync"] = phase.get("sync", 0.0) + train.pop("sync_s")
        phase["train"] = train.pop("train_s")
        end = time.perf_counter()
        return StepRecord(
            job=name,
            task=self.task.kind.value,
            step=step,
            version=step,
            router_version=held.router_version,
            start_s=start - self.t0,
            end_s=end - self.t0,
            reward_mean=statistics.fmean(rewards),
            reward_std=statistics.pstdev(rewards),
            samples=len(samples),
            turns=sum(s.turns for s in samples),
            tool_calls=tool_calls,
            prompt_tokens=sum(len(s.prompt.ids) for s in samples),
            generated_tokens=sum(sum(s.generated) for s in samples),
            phase_s=phase,
            pulled_bytes=held.pulled_bytes,
            load_kind=held.kind,
            stale_responses=sum(v != str(held.router_version) for s in samples for v in s.versions),
            **train,
        )

    async def _turn(self, rollout: RolloutClient, s: Sample, step: int, turn: int) -> None:
        g = self.config.grpo
        seed = zlib.crc32(f"{self.config.seed}/{self.spec.seed}/{s.traj}/{turn}".encode())
        out = await rollout.generate(
            s.ids,
            {
                "temperature": g.temperature,
                "max_new_tokens": 1,
                "sampling_seed": seed,
                "ignore_eos": True,
            },
            trajectory_id=s.traj,
            return_logprob=True,
        )
        tokens = list(out["output_ids"])
        meta = out["meta_info"]
        logprobs = [float(lp) for lp, _, _ in meta["output_token_logprobs"]]
        s.extend(tokens, logprobs)
        s.versions.append(str(meta["weight_version"]))
        s.answer = tokens
        s.turns += 1
        s.tool = self.task.tool_call(s.prompt, turn, tokens)

    async def _tools(self, actions: httpx.AsyncClient, active: list[Sample]) -> None:
        """The turn's tool calls, in one sandboxed run of the task's tool."""
        code = self.task.tool_code
        assert code is not None, "a task with tool calls has a tool"
        results = await _sandbox(actions, code, [s.tool for s in active])
        for s, result in zip(active, results, strict=True):
            s.extend(self.task.tool_tokens(int(result)), None)
            s.tool = None

    async def _rewards(self, actions: httpx.AsyncClient, samples: list[Sample]) -> list[float]:
        items = [{"facts": s.prompt.facts, "answer": s.answer} for s in samples]
        return [float(r) for r in await _sandbox(actions, self.task.reward_code, items)]

    async def _train(
        self, actor: DeploymentHandle, samples: list[Sample], rewards: list[float], step: int
    ) -> dict[str, Any]:
        g = self.config.grpo
        adv = group_advantages(rewards, [s.prompt.id for s in samples])
        ids, mask = _pad(
            [s.ids for s in samples], [[int(m) for m in s.generated] for s in samples],
            self.task.vocab.pad,
        )  # fmt: skip
        width = len(ids[0]) - 1
        old = [s.logprobs + [0.0] * (width - len(s.logprobs)) for s in samples]
        views: list[dict[str, Any]] = []
        out: dict[str, Any] = {"logprob_diff_max": None}
        t = time.perf_counter()
        if g.check_logprobs:
            view = await _call_view(actor, "forward", ids=ids)
            views.append(view)
            mine = view["result"]["logprobs"]
            out["logprob_diff_max"] = max(
                abs(a - b)
                for row, ref, m in zip(mine, old, mask, strict=True)
                for a, b, keep in zip(row, ref, m, strict=True)
                if keep
            )
        ratios, losses, norms, clipped = [], [], [], []
        for mb in range(g.minibatches):
            pick = list(range(mb, len(samples), g.minibatches))
            fb = await _call_view(
                actor, "forward_backward",
                ids=[ids[i] for i in pick], mask=[mask[i] for i in pick],
                old_logprobs=[old[i] for i in pick], advantages=[adv[i] for i in pick],
                loss="ppo", agg="token", clip=g.clip,
            )  # fmt: skip
            opt = await _call_view(actor, "optim_step", lr=g.lr, max_grad_norm=g.max_grad_norm)
            views += [fb, opt]
            ratios.append(fb["result"]["ratio"])
            clipped.append(fb["result"]["clipped"])
            losses.append(fb["result"]["loss"])
            norms.append(opt["result"]["grad_norm"])
        train_s = time.perf_counter() - t
        t = time.perf_counter()
        sync = await _call_view(actor, "sync_weights", relay=self._relay(), version=step + 1)
        sync_s = time.perf_counter() - t
        published = sync["result"]["published"]
        setup = sum(v["setup_s"] for v in views)
        live = [r for r in ratios if r is not None]
        return out | {
            "ratio": None if not live else {
                "mean": statistics.fmean(r["mean"] for r in live),
                "std": max(r["std"] for r in live),
                "min": min(r["min"] for r in live),
                "max": max(r["max"] for r in live),
            },
            "clipped": statistics.fmean(clipped),
            "loss": statistics.fmean(losses),
            "grad_norm": statistics.fmean(norms),
            "sync_bytes": int(published["bytes"]),
            "sync_dense_bytes": int(published["dense_bytes"]),
            "switch_s": setup + sync["setup_s"],  # the node group's offload and load
            "train_s": train_s - setup,
            "sync_s": sync_s - sync["setup_s"],
        }  # fmt: skip


def _pad(
    rows: Sequence[Sequence[int]], masks: Sequence[Sequence[int]], pad: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Rows padded on the right to one length (a causal model's earlier positions do not see
    the padding), their masks with them."""
    width = max(len(r) for r in rows)
    ids = [list(r) + [pad] * (width - len(r)) for r in rows]
    mask = [list(m) + [0] * (width - 1 - len(m)) for m in masks]
    return ids, mask


async def _call_view(actor: DeploymentHandle, op: str, **payload: Any) -> dict[str, Any]:
    """Run `op` and return its record (result, and the switch it paid, `setup_s`)."""
    op_id = await actor.submit(op, **payload)
    await actor.result(op_id)  # (raises with its error if it failed)
    return await actor.job.client.op(op_id)


async def _call(actor: DeploymentHandle, op: str, **payload: Any) -> dict[str, Any]:
    return await actor.call(op, **payload)


async def _sandbox(actions: httpx.AsyncClient, code: str, items: Sequence[Any]) -> list[Any]:
    """Run `code` in the action server's sandbox with `items` as JSON on its stdin; its
    stdout's JSON list, one result per item."""
    resp = await actions.post(
        "/run_code",
        json={"code": code, "language": "python", "stdin": json.dumps(list(items)),
              "run_timeout": 120},
    )  # fmt: skip
    if resp.is_error:
        raise RuntimeError(f"the action server refused the run ({resp.status_code}): {resp.text}")
    body = resp.json()
    run = body.get("run_result") or {}
    if body.get("status") != "Success":
        raise RuntimeError(
            f"the sandboxed script failed ({body.get('status')}): {run.get('stderr', '')[-2000:]}"
        )
    out = json.loads(run["stdout"])
    if not isinstance(out, list) or len(out) != len(items):
        raise RuntimeError(f"the sandboxed script answered {len(out)} results for {len(items)}")
    return out
