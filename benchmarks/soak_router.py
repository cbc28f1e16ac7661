"""The rollout router's memory under continuous agentic load: `--trajectories` trajectories of
3 to 6 turns at a time, each replaced by a fresh one when it ends, for `--minutes`, against
stand-in engines; the router's resident memory (RSS) is sampled every `--every-s` seconds.
What a finished trajectory leaves is bounded by `history_limit`, so memory levels off once the
predictor's history window is full (and its first fit is done).

Run: python benchmarks/soak_router.py [--minutes 10] [--trajectories 400] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from bench_rollout_router import _free_port, _process

from loom.runtime.rollout.standin import StandinProcess


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def load(url: str, n: int, seconds: float, done: list[int]) -> None:
    deadline = time.monotonic() + seconds
    rng = random.Random(1)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--trajectories", type=int, default=400)
    ap.add_argument("--every-s", type=float, default=30.0)
    ap.add_argument("--history-limit", type=int, default=20_000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with StandinProcess("--step-ms", "2") as e1, StandinProcess("--step-ms", "2") as e2:
        port = _free_port()
        cfg = Path(f"/tmp/loom-soak-{port}.toml")
        cfg.write_text(f"history_limit = {args.history_limit}\n")
        cmd = [sys.executable, "-m", "loom.cli", "serve", "rollout", "--port", str(port),
               "--engine", f"{e1.url},max_running=64", "--engine", f"{e2.url},max_running=64",
               "--config", str(cfg)]  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        with _process(cmd, url, "/health") as proc:
            done = [0, 0.0]  # trajectories finished, the longest turn (s)
            samples: list[dict[str, float]] = []
            t0 = time.monotonic()

            async def sample() -> None:
                while time.monotonic() - t0 < args.minutes * 60:
                    samples.append(
                        {
                            "t_s": time.monotonic() - t0,
                            "rss_mb": rss_mb(proc.pid),
                            "finished": done[0],
                        }
                    )
                    s = samples[-1]
                    print(
                        f"{s['t_s']:7.0f} s  RSS {s['rss_mb']:7.1f} MB  "
                        f"{s['finished']:6d} trajectories finished",
                        flush=True,
                    )
                    await asyncio.sleep(args.every_s)

            async def run() -> None:
                await asyncio.gather(
                    load(url, args.trajectories, args.minutes * 60, done), sample()
                )

            asyncio.run(run())
            samples.append(
                {"t_s": time.monotonic() - t0, "rss_mb": rss_mb(proc.pid), "finished": done[0]}
            )
        cfg.unlink(missing_ok=True)
    half = [s for s in samples if s["t_s"] >= samples[-1]["t_s"] / 2]
    grew = half[-1]["rss_mb"] - half[0]["rss_mb"]
    per = grew * 1024 / max(1, half[-1]["finished"] - half[0]["finished"])
    print(
        f"second half: {grew:+.1f} MB over {half[-1]['finished'] - half[0]['finished']} "
        f"finished trajectories ({per:+.2f} kB each); whole run "
        f"{samples[-1]['rss_mb'] - samples[0]['rss_mb']:+.1f} MB"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(samples, indent=1))


if __name__ == "__main__":
    main()
