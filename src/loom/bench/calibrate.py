"""The engines' latency profile as the router meets them, measured end to end (HTTP
streaming, the API server's per-token work, every engine busy at once as in a batch): the
rows the simulator's profiled latency model is fitted to."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from pathlib import Path

import httpx

__all__ = ["calibrate", "write_served_profile"]

ProfileRows = list[tuple[int, int, int, int, float]]


async def _timed_stream(
    http: httpx.AsyncClient, url: str, prompt: list[int], n: int
) -> tuple[float, float]:
    """(time to first token, seconds per later token) of one streamed token-id request, the
    way the router calls an engine."""
    body = {
        "model": (await http.get(url + "/v1/models")).json()["data"][0]["id"],
        "prompt": prompt,
        "max_tokens": n,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,
    }
    t0 = time.perf_counter()
    first = None
    async with http.stream("POST", url + "/v1/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data:") and "token_ids" in line:
                first = time.perf_counter()
    end = time.perf_counter()
    if first is None:
        raise RuntimeError(f"{url} streamed no token for a {len(prompt)}-token prompt")
    return first - t0, (end - first) / max(1, n - 1)


async def calibrate(urls: list[str], max_running: int) -> ProfileRows:
    """Profile rows (decode_batch, decode_context, prefill_tokens, prefill_context, seconds)
    of the engines at `urls` (OpenAI-compatible, token-id prompts): decode steps at batch
    1..max_running, prefills of 64..2048 tokens."""
    rng = random.Random(0)
    rows: ProfileRows = []
    async with httpx.AsyncClient(timeout=600) as http:
        for batch in sorted({1, 2, max(1, max_running // 2), max_running}):
            prompts = [[rng.randrange(3, 500) for _ in range(64)] for _ in range(batch)]
            runs = await asyncio.gather(
                *(_timed_stream(http, u, p, 96) for u in urls for p in prompts)
            )
            step = statistics.median(r[1] for r in runs)
            rows.append((batch, batch * (64 + 48), 0, 0, step))
        for n in (64, 512, 2048):
            runs = await asyncio.gather(
                *(
                    _timed_stream(http, u, [rng.randrange(3, 500) for _ in range(n)], 2)
                    for u in urls
                )
            )
            rows.append((0, 0, n, 0, statistics.median(r[0] for r in runs)))
    return rows


def write_served_profile(path: Path, rows: ProfileRows, kv_from: Path) -> None:
    """`rows` as a profile CSV of TP 1, with the KV capacity of profile `kv_from`."""
    from loom.perf.latency import ProfiledLatencyModel, ProfileRow, save_profile

    kv = ProfiledLatencyModel.load(kv_from).kv_capacity_tokens
    note = "end-to-end calibration by loom.bench.calibrate (streamed, all engines busy)"
    save_profile(path, [ProfileRow(*r) for r in rows], tp=1, kv_capacity_tokens=kv, note=note)
