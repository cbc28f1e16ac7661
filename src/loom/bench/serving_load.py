"""Serving traffic for lent GPUs (ROSE): a window of a serving trace (`loom.sim.workloads.
serving`: the synthetic bursty, diurnal day the reproduction uses, or an Azure trace) replayed
on the wall clock against co-serving emulated engines (`loom serve engine --emulate ...
--coserve SERVING_MODEL --role prefill|decode`), as ROSE's PD-disaggregated serving runs: each
request goes to the least loaded prefiller (requests it holds; ties to the least used, as the
simulator's `RoseRollout` routes), and once prefilled to the least loaded decoder.

Each request's TTFT is its prefiller's and its TPOT its decoder's, both in emulated (GPU)
seconds as the engines measure them, so they compare with the simulator's at any time scale.

    python -m loom.bench.serving_load --prefill URL --decode URL [--decode URL ...]
        [--rps 2.0] [--offset-s 36000] [--horizon-s 60] [--time-scale 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from loom.core.errors import ConfigError
from loom.sim.workloads.serving import ServingTrace, synthetic_day

__all__ = ["ServingLoadResult", "replay", "window"]


@dataclass
class ServingLoadResult:
    """What a replay saw: per request (in arrival order) its TTFT and TPOT in emulated
    seconds (NaN where it failed), and the failures' messages."""

    sent: int = 0
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def ended(self) -> list[int]:
        """The requests that ended (not failed, not cut off when the replay was stopped)."""
        return [i for i, x in enumerate(self.tpot_s) if not math.isnan(x)]

    def attainment(self, ttft_slo_s: float, tpot_slo_s: float) -> dict[str, float]:
        """The shares of the requests that ended within each SLO."""
        ended = self.ended()
        if not ended:
            return {"ttft": math.nan, "tpot": math.nan}
        return {
            "ttft": sum(self.ttft_s[i] <= ttft_slo_s for i in ended) / len(ended),
            "tpot": sum(self.tpot_s[i] <= tpot_slo_s for i in ended) / len(ended),
        }

    def summary(self, ttft_slo_s: float, tpot_slo_s: float) -> dict[str, Any]:
        ok = self.ended()

        def p(xs: list[float], q: float) -> float:
            v = [xs[i] for i in ok]
            return float(np.percentile(v, q)) if v else math.nan

        att = self.attainment(ttft_slo_s, tpot_slo_s)
        return {
            "sent": self.sent,
            "ended": len(ok),
            "failed": len(self.failures),
            "ttft_p50_s": p(self.ttft_s, 50),
            "ttft_p99_s": p(self.ttft_s, 99),
            "tpot_p50_s": p(self.tpot_s, 50),
            "tpot_p99_s": p(self.tpot_s, 99),
            "ttft_attainment": att["ttft"],
            "tpot_attainment": att["tpot"],
        }


def window(trace: ServingTrace, offset_s: float, horizon_s: float) -> list[tuple[float, int, int]]:
    """The requests arriving in [offset, offset + horizon): (seconds after the window opens,
    prompt tokens, output tokens), each at least one token as the simulator takes them."""
    if horizon_s <= 0:
        raise ConfigError(f"horizon_s must be > 0, got {horizon_s}")
    arr = trace.arrival_s
    lo = int(np.searchsorted(arr, offset_s, side="left"))
    hi = int(np.searchsorted(arr, offset_s + horizon_s, side="left"))
    return [
        (
            float(arr[i]) - offset_s,
            max(1, int(trace.prompt_tokens[i])),
            max(1, int(trace.output_tokens[i])),
        )
        for i in range(lo, hi)
    ]


class _Pool:
    """Engines of one role, least loaded first (requests held, then requests served)."""

    def __init__(self, urls: Sequence[str], role: str) -> None:
        if not urls:
            raise ConfigError(f"serving needs at least one {role} engine")
        self.urls = list(urls)
        self.held = [0] * len(urls)
        self.served = [0] * len(urls)

    def pick(self) -> int:
        i = min(range(len(self.urls)), key=lambda j: (self.held[j], self.served[j], j))
        self.held[i] += 1
        self.served[i] += 1
        return i


async def replay(
    requests: Sequence[tuple[float, int, int]],
    model: str,
    prefillers: Sequence[str],
    decoders: Sequence[str],
    *,
    time_scale: float,
    timeout_s: float = 600.0,
    into: ServingLoadResult | None = None,
) -> ServingLoadResult:
    """Send `requests` ((emulated seconds from now, prompt, output) in order) on the wall
    clock (`time_scale` wall seconds per emulated second) through the prefillers, then the
    decoders; returns once every request has ended or failed. Cancelled (the rollout it ran
    beside ended), the requests in flight are dropped: `ServingLoadResult.ended` says which
    ended; what a cancelled replay saw is in `into`, where given. (aiohttp, not httpx: at a
    tenth of the GPU's time the lent engines take hundreds of requests a wall second, and
    httpx's CPU per request made the replay late on two cores.)"""
    if not time_scale > 0:
        raise ConfigError(f"time_scale must be > 0, got {time_scale}")
    pre, dec = _Pool(prefillers, "prefill"), _Pool(decoders, "decode")
    out = into if into is not None else ServingLoadResult()
    out.sent = 0
    out.ttft_s = [math.nan] * len(requests)
    out.tpot_s = [math.nan] * len(requests)
    headers = {"Content-Type": "application/json"}

    async def post(http: aiohttp.ClientSession, url: str, body: bytes) -> dict[str, Any]:
        async with http.post(url + "/v1/completions", data=body, headers=headers) as r:
            raw = await r.read()
            if r.status != 200:
                raise RuntimeError(f"{url}: {r.status} {raw[:200]!r}")
            data: dict[str, Any] = orjson.loads(raw)["loom_serving"]
            return data

    async def one(http: aiohttp.ClientSession, k: int, prompt: int, output: int) -> None:
        body = orjson.dumps({"model": model, "prompt": [7] * prompt, "max_tokens": output})
        try:
            i = pre.pick()
            try:
                ttft = float((await post(http, pre.urls[i], body))["ttft_s"])
            finally:
                pre.held[i] -= 1
            j = dec.pick()
            try:
                tpot = float((await post(http, dec.urls[j], body))["tpot_s"])
            finally:
                dec.held[j] -= 1
            out.ttft_s[k], out.tpot_s[k] = ttft, tpot
        except (aiohttp.ClientError, RuntimeError, KeyError, TypeError, ValueError) as exc:
            out.failures.append(f"request {k}: {exc!r}")

    start = time.monotonic()
    tasks = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        try:
            for k, (at, prompt, output) in enumerate(requests):
                delay = start + at * time_scale - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(http, k, prompt, output)))
                out.sent = k + 1
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loom.bench.serving_load", description=__doc__)
    p.add_argument("--prefill", action="append", required=True, help="a prefiller's URL")
    p.add_argument("--decode", action="append", required=True, help="a decoder's URL")
    p.add_argument("--model", default="qwen2.5-7b", help="the serving model")
    p.add_argument("--rps", type=float, default=2.0, help="the day's mean requests/s")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--offset-s", type=float, default=36000.0, help="where in the day (10:00)")
    p.add_argument("--horizon-s", type=float, default=60.0, help="emulated seconds replayed")
    p.add_argument("--time-scale", type=float, default=1.0, help="as the engines run")
    p.add_argument("--ttft-slo-s", type=float, default=0.5)
    p.add_argument("--tpot-slo-s", type=float, default=0.15)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="also write the summary and each request's "
        "TTFT and TPOT here as JSON (SIGTERM stops the replay and writes what it saw)",
    )
    args = p.parse_args(argv)
    result = ServingLoadResult()
    try:
        day = synthetic_day(mean_rps=args.rps, seed=args.seed)
        reqs = window(day, args.offset_s, args.horizon_s)
    except ConfigError as exc:
        p.error(str(exc))

    async def run() -> None:
        task = asyncio.create_task(
            replay(
                reqs, args.model, args.prefill, args.decode, time_scale=args.time_scale,
                into=result,
            )
        )  # fmt: skip
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())
    summary = result.summary(args.ttft_slo_s, args.tpot_slo_s)
    for k, v in summary.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}", flush=True)
    if args.out is not None:
        ended = result.ended()
        doc = {
            "summary": summary,
            "ttft_s": [result.ttft_s[i] for i in ended],
            "tpot_s": [result.tpot_s[i] for i in ended],
            "failures": result.failures[:20],
        }
        args.out.write_text(json.dumps(doc))


if __name__ == "__main__":
    main()
