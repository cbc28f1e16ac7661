"""The rollout router's overhead: latency it adds to a request against calling the engine
directly (p50, p99), the router's CPU per request, and requests per second, at 1, 8 and 200
concurrent requests, beside `sglang-router` (the Rust router SGLang ships) over the same
engine. Targets (issue 26): <= 1 ms added at the p50 at concurrency 1, <= 2x sglang-router's
CPU per request, >= 0.8x its requests/s at concurrency 8.

Prompts are text by default (what OpenAI clients send): Loom tokenizes them itself (the tiny
model's tokenizer, `--tokenizer`), sglang-router forwards the text and the engine tokenizes;
`--prompt ids` sends token ids instead. The engine is Loom's stand-in SGLang engine on a
0.1 ms step, one token per request, so what is measured is the routers' request path, not
generation. Every process (engine, router, load generator) runs on this machine: on two cores
the concurrent figures include the CPU the router takes from the engine and the load
generator. Each run alternates direct and routed rounds so that drift hits both alike.

Run: python benchmarks/bench_rollout_router.py [--requests 2000] [--prompt text|ids]
     [--json out.json]

`--continuous` measures something else: scheduling under continuous load (issue 28 §1).
Trajectories of 3-6 turns keep arriving for two minutes (400 by default) at two stand-in
engines that each run a few requests at once and charge a prefill per uncached token;
output lengths are long-tailed, tool calls take 0.5-3 s. Loom's router runs heddle+pps and
fcfs (least-load placement) over the same arrivals, interleaved, and prints side by side
the p50/p99 turn latency, the share of turns over a minute, the longest wait in the router,
preemptions per turn, tokens prefilled again (by why) and throughput.

Run: python benchmarks/bench_rollout_router.py --continuous [--trajectories 400]
     [--duration-s 120] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp

from loom.runtime.rollout.standin import StandinProcess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, path: str, timeout_s: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url}{path} did not come up in {timeout_s:.0f} s")


@contextmanager
def _process(
    cmd: list[str], url: str, ready: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    # Output to a file, not /dev/null: sglang-router 0.3 never starts serving with its output
    # on /dev/null (observed here); the file's tail also says why a server did not come up.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            try:
                _wait(url, ready)
            except RuntimeError as exc:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"{exc}; {cmd[2]} said:\n{tail}") from None
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextmanager
def standin(step_ms: float) -> Iterator[str]:
    with StandinProcess("--step-ms", str(step_ms), "--max-running", "4096") as engine:
        yield engine.url


@contextmanager
def loom_router(engine: str, tokenizer: str | None) -> Iterator[tuple[str, int]]:
    port = _free_port()
    cmd = [
        sys.executable, "-m", "loom.cli", "serve", "rollout", "--port", str(port),
        "--engine", f"{engine},max_running=4096", "--placement", "least_load",
        "--scheduler", "fcfs",
    ]  # fmt: skip
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    url = f"http://127.0.0.1:{port}"
    with _process(cmd, url, "/health") as proc:
        yield url, proc.pid


@contextmanager
def sglang_router(*engines: str, policy: str = "round_robin") -> Iterator[tuple[str, int] | None]:
    """sglang-router over the same engines, when installed (pip install sglang-router), with
    one of its policies (random, round_robin, cache_aware, power_of_two, manual)."""
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        yield None
        return
    port = _free_port()
    cmd = [
        sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *engines,
        "--port", str(port), "--host", "127.0.0.1", "--policy", policy,
        "--prometheus-port", str(_free_port()),  # its default (29000) may be taken
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with _process(cmd, url, "/health") as proc:
        _wait_workers(url, len(engines))
        yield url, proc.pid


def _wait_workers(url: str, n: int, timeout_s: float = 60.0) -> None:
    """sglang-router answers /health before it has registered its workers (a background
    workflow); requests before then get 503 no_available_workers."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = httpx.get(url + "/workers", timeout=5).json().get("workers", [])
        if len(workers) == n and all(w.get("is_healthy") for w in workers):
            return
        time.sleep(0.1)
    raise RuntimeError(f"sglang-router at {url} had not registered {n} workers in {timeout_s} s")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PROMPTS = {
    "text": {"text": "defi duli fofi bila benu defi duli fofi bila benu defi duli"},
    "ids": {"input_ids": [1, 2, 3, 4]},
}


async def _load(url: str, n: int, concurrency: int, prompt: str) -> tuple[list[float], float]:
    """Latencies of `n` requests `concurrency` at a time, and the wall time they took."""
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


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def measure(
    engine: str, routed: str, pid: int, n: int, concurrency: int, rounds: int, prompt: str
) -> dict[str, float]:
    direct: list[float] = []
    via: list[float] = []
    asyncio.run(_load(engine, min(n, 200), concurrency, prompt))  # warm both paths
    asyncio.run(_load(routed, min(n, 200), concurrency, prompt))
    cpu = wall = 0.0
    for _ in range(rounds):
        direct += asyncio.run(_load(engine, n // rounds, concurrency, prompt))[0]
        c0 = _cpu_s(pid)
        lat, took = asyncio.run(_load(routed, n // rounds, concurrency, prompt))
        cpu += _cpu_s(pid) - c0
        via += lat
        wall += took
    d50, d99 = _pct(direct, 0.5), _pct(direct, 0.99)
    v50, v99 = _pct(via, 0.5), _pct(via, 0.99)
    return {
        "direct_p50_ms": d50 * 1e3,
        "direct_p99_ms": d99 * 1e3,
        "routed_p50_ms": v50 * 1e3,
        "routed_p99_ms": v99 * 1e3,
        "added_p50_ms": (v50 - d50) * 1e3,
        "added_p99_ms": (v99 - d99) * 1e3,
        "router_cpu_ms_per_request": cpu / len(via) * 1e3,
        "requests_per_s": len(via) / wall,
        "requests": len(via),
    }


def _ratios(rows: list[dict[str, Any]]) -> None:
    """Loom against sglang-router, as the targets are stated."""
    by = {(r["router"], r["concurrency"]): r for r in rows}
    if ("sglang-router", 1) not in by or ("loom", 1) not in by:
        return
    loom1, sg1 = by["loom", 1], by["sglang-router", 1]
    cpu = loom1["router_cpu_ms_per_request"] / sg1["router_cpu_ms_per_request"]
    rps = by["loom", 8]["requests_per_s"] / by["sglang-router", 8]["requests_per_s"]
    print(
        f"Loom: {loom1['added_p50_ms']:.2f} ms added at the p50 (target <= 1; sglang-router "
        f"{sg1['added_p50_ms']:.2f}); CPU per request {cpu:.2f}x sglang-router's (target <= 2); "
        f"requests/s at concurrency 8 {rps:.2f}x sglang-router's (target >= 0.8)"
    )


# ---- continuous load (--continuous) ----------------------------------------------------------

CONTINUOUS_SYSTEMS = {  # name: (placement, scheduler)
    "heddle+pps": ("heddle", "pps"),
    "fcfs": ("least_load", "fcfs"),
}


def _trajectories(n: int, duration_s: float, seed: int) -> list[dict[str, Any]]:
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


@contextmanager
def continuous_router(
    engines: list[str], placement: str, scheduler: str, profile: str, path: str | None = None
) -> Iterator[str]:
    """Loom's router in a process of its own; `path`: the source tree it runs from (another
    checkout's `src`, to compare with an earlier router)."""
    port = _free_port()
    cmd = [
        sys.executable, "-m", "loom.cli", "serve", "rollout", "--port", str(port),
        "--placement", placement, "--scheduler", scheduler, "--profile", profile,
        "--tokenizer", "engine",
    ]  # fmt: skip
    for e in engines:
        cmd += ["--engine", e]
    url = f"http://127.0.0.1:{port}"
    with _process(cmd, url, "/health", {**os.environ, "PYTHONPATH": path} if path else None):
        yield url


async def _run_trajectories(url: str, trajs: list[dict[str, Any]]) -> dict[str, Any]:
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
        "p50_s": _pct(latencies, 0.5),
        "p99_s": _pct(latencies, 0.99),
        "over_60s_pct": 100 * sum(x > 60 for x in latencies) / max(1, turns),
        # NOTE: read with defaults, so that a router from before issue 28 runs it too
        "longest_wait_s": stats["timing"].get("longest_wait_s", float("nan")),
        "preemptions_per_turn": stats["policy"]["preemptions"] / max(1, turns),
        "late_bindings": stats["policy"].get("late_bindings", 0),
        "aged": stats["policy"].get("aged", 0),
        "migrations": stats["policy"]["migrations"],
        "reprefill_tokens": stats.get("reprefill_tokens", {}),
        "tokens_per_s": tokens / makespan,
        "makespan_s": makespan,
    }


def continuous(args: argparse.Namespace) -> list[dict[str, Any]]:
    from loom.runtime.rollout.standin import write_standin_profile

    step_s, prefill_s = args.step_ms / 1000, args.prefill_us_per_token / 1e6
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        profile = os.path.join(tmp, "standin.csv")
        write_standin_profile(profile, step_s, prefill_s)
        flags = [
            "--step-ms", str(args.step_ms), "--max-running", str(args.engine_running),
            "--prefill-us-per-token", str(args.prefill_us_per_token), "--priority",
        ]  # fmt: skip
        for rep in range(args.repeats):
            trajs = _trajectories(args.trajectories, args.duration_s, args.seed + rep)
            for name, (placement, scheduler) in CONTINUOUS_SYSTEMS.items():
                # fresh engines per run: no prefix cache or queue carried over
                with (
                    StandinProcess(*flags) as e0,
                    StandinProcess(*flags) as e1,
                    continuous_router(
                        [e0.url, e1.url], placement, scheduler, profile, args.router_path
                    ) as url,
                ):
                    row = {"system": name, "repeat": rep}
                    row |= asyncio.run(_run_trajectories(url, trajs))
                rows.append(row)
                again = ", ".join(f"{k} {v}" for k, v in row["reprefill_tokens"].items() if v)
                print(
                    f"{name:>10} run {rep}: p50 {row['p50_s']:5.2f} s, p99 {row['p99_s']:6.2f} s, "
                    f"over 60 s {row['over_60s_pct']:.2f}%, longest wait "
                    f"{row['longest_wait_s']:6.2f} s, preemptions/turn "
                    f"{row['preemptions_per_turn']:.3f}, {row['tokens_per_s']:6.0f} tokens/s, "
                    f"makespan {row['makespan_s']:.0f} s, turns {row['turns']} "
                    f"(failed {row['failed']}), late bindings {row['late_bindings']}, aged "
                    f"{row['aged']}, prefilled again: {again or 'none'}",
                    flush=True,
                )
    by = {name: [r for r in rows if r["system"] == name] for name in CONTINUOUS_SYSTEMS}
    fcfs = by["fcfs"]
    for name, rs in by.items():
        ratio = sum(r["tokens_per_s"] for r in rs) / sum(r["tokens_per_s"] for r in fcfs)
        print(f"{name:>10}: throughput {ratio:.2f}x fcfs's")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=2000, help="routed requests per setting")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--step-ms", type=float, default=0.1)
    ap.add_argument("--prompt", choices=sorted(PROMPTS), default="text")
    ap.add_argument("--json", default=None, help="write the rows here too")
    ap.add_argument("--continuous", action="store_true", help="scheduling under load instead")
    ap.add_argument("--trajectories", type=int, default=400)
    ap.add_argument("--duration-s", type=float, default=120.0, help="arrivals spread over")
    ap.add_argument("--engine-running", type=int, default=8, help="continuous: each engine")
    ap.add_argument("--prefill-us-per-token", type=float, default=20.0, help="continuous")
    ap.add_argument("--repeats", type=int, default=1, help="continuous: interleaved runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--router-path", default=None, help="continuous: the router's source tree")
    args = ap.parse_args()
    if args.continuous:
        if args.step_ms == ap.get_default("step_ms"):
            args.step_ms = 10.0
        rows = continuous(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
    tokenizer = None
    if args.prompt == "text":
        from loom.runtime.engine.model import TinyModelSpec, build_tiny_model

        tokenizer = str(build_tiny_model(TinyModelSpec()))
    rows: list[dict[str, Any]] = []
    with standin(args.step_ms) as engine:
        routers = {
            "loom": loom_router(engine, tokenizer),
            "sglang-router": sglang_router(engine),
        }
        for name, ctx in routers.items():
            with ctx as found:
                if found is None:
                    print(f"{name}: not installed (pip install sglang-router); skipped")
                    continue
                for conc in (1, 8, 200):
                    n = args.requests if conc == 1 else args.requests * 4
                    row = {"router": name, "concurrency": conc, "prompt": args.prompt}
                    url, pid = found
                    row |= measure(engine, url, pid, n, conc, args.rounds, args.prompt)
                    rows.append(row)
                    print(
                        f"{name:>14} x{conc:<3}  direct p50 {row['direct_p50_ms']:6.2f} ms "
                        f"p99 {row['direct_p99_ms']:6.2f} | routed p50 {row['routed_p50_ms']:6.2f}"
                        f" p99 {row['routed_p99_ms']:6.2f} | added p50 {row['added_p50_ms']:+6.2f}"
                        f" ms, p99 {row['added_p99_ms']:+6.2f} ms | router CPU "
                        f"{row['router_cpu_ms_per_request']:.2f} ms/request | "
                        f"{row['requests_per_s']:7.0f} requests/s",
                        flush=True,
                    )
    _ratios(rows)
    uvloop = importlib.util.find_spec("uvloop") is not None
    print(
        f"machine: {os.cpu_count()} cores; Loom's event loop: {'uvloop' if uvloop else 'asyncio'}"
        f"; prompts: {args.prompt}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
