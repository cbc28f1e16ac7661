"""A router under continuous agentic load for a while: trajectories of 3 to 6 turns, each
replaced by a fresh one when it ends, while the router's resident memory is sampled."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from loom.bench.measure import rss_mb

__all__ = ["growth", "keep_busy", "soak"]


async def keep_busy(url: str, n: int, seconds: float, done: list[int], seed: int = 1) -> None:
    """`n` trajectories at a time through the router at `url` for `seconds`: each sends 3 to
    6 turns of SGLang's `/generate` (a context of 8-64 tokens growing by each output and a
    token of tool reply, 4-32 tokens asked, a tool call of up to 0.2 s between), ends, and
    starts another; `done[0]` counts those finished."""
    deadline = time.monotonic() + seconds
    rng = random.Random(seed)
    counter = [0]
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
    )
    async with session as http:

        async def trajectory() -> None:
            while time.monotonic() < deadline:
                counter[0] += 1
                key = f"soak-{counter[0]}"
                ctx = [rng.randrange(3, 30000) for _ in range(rng.randint(8, 64))]
                for k in range(rng.randint(3, 6)):
                    body = {
                        "input_ids": ctx,
                        "sampling_params": {
                            "max_new_tokens": rng.randint(4, 32),
                            "ignore_eos": True,
                        },
                    }
                    async with http.post(
                        url + "/generate", json=body, headers={"X-Trajectory-Id": key}
                    ) as resp:
                        out = await resp.json()
                        if resp.status != 200:
                            raise RuntimeError(f"{resp.status}: {out}")
                    ctx = ctx + out["output_ids"] + [100 + k]
                    await asyncio.sleep(rng.uniform(0.0, 0.2))  # the tool call
                async with http.post(f"{url}/v1/trajectories/{key}/end") as resp:
                    await resp.read()
                done[0] += 1

        await asyncio.gather(*(trajectory() for _ in range(n)))


def soak(
    url: str,
    pid: int,
    *,
    trajectories: int,
    seconds: float,
    every_s: float,
    seed: int = 1,
    on_sample: Callable[[dict[str, Any]], None] = lambda s: None,
) -> list[dict[str, Any]]:
    """`keep_busy` for `seconds` against the router at `url` (process `pid`), its resident
    memory sampled every `every_s` seconds and once at the end: samples of `t_s`, `rss_mb`
    and `finished` (trajectories so far), each also passed to `on_sample`."""
    done = [0]
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()

    def take() -> None:
        samples.append({"t_s": time.monotonic() - t0, "rss_mb": rss_mb(pid), "finished": done[0]})
        on_sample(samples[-1])

    async def sample() -> None:
        while time.monotonic() - t0 < seconds:
            take()
            await asyncio.sleep(every_s)

    async def run() -> None:
        await asyncio.gather(keep_busy(url, trajectories, seconds, done, seed), sample())

    asyncio.run(run())
    take()
    return samples


def growth(samples: list[dict[str, Any]]) -> dict[str, float]:
    """How memory grew: over the second half of the run (MB, trajectories finished, kB per
    trajectory) and over the whole run (MB)."""
    half = [s for s in samples if s["t_s"] >= samples[-1]["t_s"] / 2]
    grew = half[-1]["rss_mb"] - half[0]["rss_mb"]
    finished = half[-1]["finished"] - half[0]["finished"]
    return {
        "second_half_growth_mb": grew,
        "second_half_finished": finished,
        "growth_per_trajectory_kb": grew * 1024 / max(1, finished),
        "whole_run_growth_mb": samples[-1]["rss_mb"] - samples[0]["rss_mb"],
    }
