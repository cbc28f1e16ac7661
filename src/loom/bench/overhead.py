"""What a router adds to a request: latency against calling the engine directly (p50, p99),
the router's CPU per request and requests per second, at a given concurrency, direct and
routed rounds alternating so that drift hits both alike."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from loom.bench.measure import cpu_s, percentile

__all__ = ["FLOOR", "PROMPTS", "load", "measure", "ratios"]

# a request's prompt: text (what OpenAI clients send; Loom tokenizes it itself, sglang-router
# forwards it) or token ids
PROMPTS: dict[str, dict[str, Any]] = {
    "text": {"text": "defi duli fofi bila benu defi duli fofi bila benu defi duli"},
    "ids": {"input_ids": [1, 2, 3, 4]},
}


async def load(url: str, n: int, concurrency: int, prompt: str) -> tuple[list[float], float]:
    """Latencies of `n` one-token SGLang `/generate` requests, `concurrency` at a time, and
    the wall seconds they took."""
    body = json.dumps(
        {**PROMPTS[prompt], "sampling_params": {"max_new_tokens": 1, "ignore_eos": True}}
    ).encode()
    headers = {"Content-Type": "application/json"}
    lat: list[float] = []
    left = [n]
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as http:

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                t0 = time.perf_counter()
                async with http.post(url + "/generate", data=body, headers=headers) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{url}: {resp.status} {await resp.text()}")
                lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return lat, wall


def measure(
    engine: str, routed: str, pid: int, n: int, concurrency: int, rounds: int, prompt: str
) -> dict[str, float | None]:
    """`n` requests through the router at `routed` (process `pid`) and as many straight to
    `engine`, in `rounds` alternating rounds after a warm-up of each path."""
    direct: list[float] = []
    via: list[float] = []
    asyncio.run(load(engine, min(n, 200), concurrency, prompt))  # warm both paths
    asyncio.run(load(routed, min(n, 200), concurrency, prompt))
    cpu = wall = 0.0
    for _ in range(rounds):
        direct += asyncio.run(load(engine, n // rounds, concurrency, prompt))[0]
        c0 = cpu_s(pid)
        lat, took = asyncio.run(load(routed, n // rounds, concurrency, prompt))
        cpu += cpu_s(pid) - c0
        via += lat
        wall += took
    d50, d99 = percentile(direct, 0.5), percentile(direct, 0.99)
    v50, v99 = percentile(via, 0.5), percentile(via, 0.99)
    return {
        "direct_p50_ms": d50 * 1e3,
        "direct_p99_ms": d99 * 1e3,
        "routed_p50_ms": v50 * 1e3,
        "routed_p99_ms": v99 * 1e3,
        "added_p50_ms": (v50 - d50) * 1e3,
        "added_p99_ms": (v99 - d99) * 1e3,
        # NOTE: CPU is counted in clock ticks (10 ms): a run that spent less is not measured
        "router_cpu_ms_per_request": cpu / len(via) * 1e3 if cpu > 0 else None,
        "requests_per_s": len(via) / wall,
        "requests": len(via),
    }


FLOOR = "aiohttp-proxy"  # the bare proxy's name in the records (`loom.bench.proxy`)


def ratios(rows: Sequence[dict[str, Any]]) -> dict[str, float | None] | None:
    """Loom against sglang-router as the targets state them: Loom's added p50 at concurrency 1
    (target <= 1 ms) beside sglang-router's, CPU per request at concurrency 1 over
    sglang-router's (target <= 2; None where either spent less than a clock tick) and
    requests/s at concurrency 8 over sglang-router's (target >= 0.8); None unless both routers
    ran at 1 and 8. Where the bare aiohttp proxy ran too, the same figures of that floor and
    Loom's CPU per request over it."""
    by = {(r["router"], r["concurrency"]): r for r in rows}
    if not all((router, c) in by for router in ("loom", "sglang-router") for c in (1, 8)):
        return None
    loom1, sg1 = by["loom", 1], by["sglang-router", 1]
    cpu, sg_cpu = loom1["router_cpu_ms_per_request"], sg1["router_cpu_ms_per_request"]
    out: dict[str, float | None] = {
        "loom_added_p50_ms": loom1["added_p50_ms"],
        "sglang_router_added_p50_ms": sg1["added_p50_ms"],
        "cpu_per_request_over_sglang_router": cpu / sg_cpu if cpu and sg_cpu else None,
        "requests_per_s_over_sglang_router": by["loom", 8]["requests_per_s"]
        / by["sglang-router", 8]["requests_per_s"],
    }
    if all((FLOOR, c) in by for c in (1, 8)):  # the bare proxy on Loom's HTTP stack
        floor1 = by[FLOOR, 1]
        f_cpu = floor1["router_cpu_ms_per_request"]
        out |= {
            "floor_added_p50_ms": floor1["added_p50_ms"],
            "floor_cpu_per_request_over_sglang_router": f_cpu / sg_cpu
            if f_cpu and sg_cpu
            else None,
            "floor_requests_per_s_over_sglang_router": by[FLOOR, 8]["requests_per_s"]
            / by["sglang-router", 8]["requests_per_s"],
            "cpu_per_request_over_floor": cpu / f_cpu if cpu and f_cpu else None,
        }
    return out
