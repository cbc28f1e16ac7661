"""Scheduling under continuous load: trajectories of 3-6 turns keep arriving at stand-in
engines that each run a few requests at once and charge a prefill per uncached token, with
long-tailed outputs and tool calls of 0.5-3 s; per run, turn latencies, the longest wait in
the router, preemptions, tokens prefilled again (by why) and throughput."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from loom.bench.measure import percentile
from loom.bench.routers import ServedRouter

__all__ = ["CONTINUOUS_SYSTEMS", "run_continuous", "run_trajectories", "trajectories"]

CONTINUOUS_SYSTEMS = {  # name: (placement, scheduler)
    "heddle+pps": ("heddle", "pps"),
    "fcfs": ("least_load", "fcfs"),
}


def trajectories(n: int, duration_s: float, seed: int) -> list[dict[str, Any]]:
    """`n` trajectories arriving uniformly over `duration_s`: 3-6 turns each, a 200-token
    prompt, tool outputs of 20-200 tokens, long-tailed outputs (lognormal, median 60
    tokens, capped at 1,000), tool calls of 0.5-3 s."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        turns = int(rng.integers(3, 7))
        out.append(
            {
                "id": f"c{seed}-{i}",
                "arrival_s": float(rng.uniform(0, duration_s)),
                "prompt": [int(x) for x in rng.integers(3, 30000, 200)],
                "outputs": [int(min(1000, max(4, rng.lognormal(np.log(60), 1.0))))
                            for _ in range(turns)],
                "tools": [[int(x) for x in rng.integers(3, 30000, int(rng.integers(20, 201)))]
                          for _ in range(turns - 1)],
                "tool_s": [float(rng.uniform(0.5, 3.0)) for _ in range(turns - 1)],
            }
        )  # fmt: skip
    return out


async def run_trajectories(url: str, trajs: list[dict[str, Any]]) -> dict[str, Any]:
    """`trajs` through the router at `url` as they arrive (SGLang's `/generate` with token
    ids), each ended after its last turn; the run's figures, flat (tokens prefilled again
    by why as `reprefill_<why>_tokens`)."""
    latencies: list[float] = []
    tokens = 0
    failed = 0
    t0 = time.monotonic()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=None)
    ) as http:

        async def one(traj: dict[str, Any]) -> None:
            nonlocal tokens, failed
            await asyncio.sleep(max(0.0, t0 + traj["arrival_s"] - time.monotonic()))
            context = list(traj["prompt"])
            for k, n in enumerate(traj["outputs"]):
                body = {
                    "input_ids": context,
                    "sampling_params": {"max_new_tokens": n, "ignore_eos": True},
                }
                start = time.monotonic()
                async with http.post(
                    url + "/generate", json=body, headers={"X-Trajectory-Id": traj["id"]}
                ) as resp:
                    data = await resp.json()
                latencies.append(time.monotonic() - start)
                if resp.status != 200:
                    failed += 1
                    break
                out = data["output_ids"]
                tokens += len(out)
                context += out
                if k < len(traj["tools"]):
                    await asyncio.sleep(traj["tool_s"][k])
                    context += traj["tools"][k]
            async with http.post(f"{url}/v1/trajectories/{traj['id']}/end") as resp:
                await resp.read()

        await asyncio.gather(*(one(t) for t in trajs))
        async with http.get(url + "/v1/stats") as resp:
            stats = await resp.json()
    makespan = time.monotonic() - t0
    turns = len(latencies)
    return {
        "turns": turns,
        "failed": failed,
        "p50_s": percentile(latencies, 0.5),
        "p99_s": percentile(latencies, 0.99),
        "over_60s_pct": 100 * sum(x > 60 for x in latencies) / max(1, turns),
        # NOTE: read with defaults, so that a router from before issue 28 runs it too
        "longest_wait_s": stats["timing"].get("longest_wait_s", float("nan")),
        "preemptions_per_turn": stats["policy"]["preemptions"] / max(1, turns),
        "late_bindings": stats["policy"].get("late_bindings", 0),
        "aged": stats["policy"].get("aged", 0),
        "migrations": stats["policy"]["migrations"],
        **{f"reprefill_{k}_tokens": v for k, v in stats.get("reprefill_tokens", {}).items()},
        "tokens_per_s": tokens / makespan,
        "makespan_s": makespan,
    }


def run_continuous(
    system: str,
    trajs: list[dict[str, Any]],
    engine_flags: Sequence[str],
    profile: Path,
    router_path: str | None = None,
) -> dict[str, Any]:
    """One run of `trajs` through Loom's router as `system` (`CONTINUOUS_SYSTEMS`) over two
    fresh stand-in engines started with `engine_flags` (no prefix cache or queue carried
    over), the router planning with `profile`; `router_path`: the source tree the router
    runs from (another checkout's `src`)."""
    from loom.bench.fleet import StandinEngines

    placement, scheduler = CONTINUOUS_SYSTEMS[system]
    env = {**os.environ, "PYTHONPATH": router_path} if router_path else None
    with StandinEngines(2, *engine_flags) as fleet:
        flags = ["--placement", placement, "--scheduler", scheduler, "--profile", str(profile),
                 "--tokenizer", "engine"]  # fmt: skip
        for url in fleet.urls:
            flags += ["--engine", url]
        with ServedRouter(flags, env=env) as router:
            return asyncio.run(run_trajectories(router.url, trajs))
