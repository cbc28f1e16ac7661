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

The harness is `loom.bench` (`overhead`, `continuous`); `--json PATH` writes one results
document (`loom.bench.results`): per router and concurrency a record `"overhead"` and the
targets' ratios `"ratios"`; with `--continuous` a record `"run"` per system and repeat and
`"system"` with each system's throughput over fcfs's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

from loom.bench.continuous import CONTINUOUS_SYSTEMS, run_continuous, trajectories
from loom.bench.fleet import StandinEngines
from loom.bench.overhead import FLOOR, PROMPTS, measure, ratios
from loom.bench.progress import RunProgress
from loom.bench.results import results, write_results
from loom.bench.routers import (
    PeerUnavailableError,
    ProxyRouter,
    Router,
    ServedRouter,
    SglangRouter,
)

Record = dict[str, Any]
CONCURRENCY = (1, 8, 200)


def continuous(args: argparse.Namespace) -> list[Record]:
    from loom.runtime.rollout.standin import write_standin_profile

    step_s, prefill_s = args.step_ms / 1000, args.prefill_us_per_token / 1e6
    rows: list[Record] = []
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "standin.csv"
        write_standin_profile(profile, step_s, prefill_s)
        flags = [
            "--step-ms", str(args.step_ms), "--max-running", str(args.engine_running),
            "--prefill-us-per-token", str(args.prefill_us_per_token), "--priority",
        ]  # fmt: skip
        with RunProgress(args.repeats * len(CONTINUOUS_SYSTEMS), "runs") as bar:
            for rep in range(args.repeats):
                trajs = trajectories(args.trajectories, args.duration_s, args.seed + rep)
                for name in CONTINUOUS_SYSTEMS:
                    bar.step(f"{name} #{rep}")
                    row = {"record": "run", "system": name, "repeat": rep}
                    row |= run_continuous(name, trajs, flags, profile, args.router_path)
                    rows.append(row)
                    _print_run(row)
                    bar.advance()
    for name in CONTINUOUS_SYSTEMS:
        ratio = _total(rows, name) / _total(rows, "fcfs")
        print(f"{name:>10}: throughput {ratio:.2f}x fcfs's")
        rows.append({"record": "system", "system": name, "throughput_over_fcfs": ratio})
    return rows


def _total(rows: list[Record], name: str) -> float:
    return sum(r["tokens_per_s"] for r in rows if r["system"] == name and r["record"] == "run")


def _print_run(row: Record) -> None:
    again = ", ".join(
        f"{k[len('reprefill_') : -len('_tokens')]} {v}"
        for k, v in row.items()
        if k.startswith("reprefill_") and v
    )
    print(
        f"{row['system']:>10} run {row['repeat']}: p50 {row['p50_s']:5.2f} s, p99 "
        f"{row['p99_s']:6.2f} s, over 60 s {row['over_60s_pct']:.2f}%, longest wait "
        f"{row['longest_wait_s']:6.2f} s, preemptions/turn {row['preemptions_per_turn']:.3f}, "
        f"{row['tokens_per_s']:6.0f} tokens/s, makespan {row['makespan_s']:.0f} s, turns "
        f"{row['turns']} (failed {row['failed']}), late bindings {row['late_bindings']}, aged "
        f"{row['aged']}, prefilled again: {again or 'none'}",
        flush=True,
    )


def _routers(engine: str, tokenizer: str | None) -> dict[str, Router]:
    """Loom's router (least-load placement, fcfs), sglang-router and a bare aiohttp proxy
    over `engine`."""
    flags = ["--engine", f"{engine},max_running=4096", "--placement", "least_load",
             "--scheduler", "fcfs"]  # fmt: skip
    if tokenizer:
        flags += ["--tokenizer", tokenizer]
    return {
        "loom": ServedRouter(flags),
        "sglang-router": SglangRouter([engine]),
        FLOOR: ProxyRouter(engine),  # the floor of Loom's HTTP stack: forwards bytes unread
    }


def overhead(args: argparse.Namespace) -> list[Record]:
    tokenizer = None
    if args.prompt == "text":
        from loom.runtime.engine.model import TinyModelSpec, build_tiny_model

        tokenizer = str(build_tiny_model(TinyModelSpec()))
    uvloop = importlib.util.find_spec("uvloop") is not None
    rows: list[Record] = []
    with (
        StandinEngines(1, "--step-ms", str(args.step_ms), "--max-running", "4096") as fleet,
        RunProgress(3 * len(CONCURRENCY), "settings") as bar,
    ):
        engine = fleet.urls[0]
        for name, router in _routers(engine, tokenizer).items():
            try:
                router.start()
            except PeerUnavailableError as exc:
                print(f"{name}: {exc}; skipped")
                bar.advance(len(CONCURRENCY))
                continue
            try:
                assert router.pid is not None, "both routers run in processes of their own"
                for conc in CONCURRENCY:
                    bar.step(f"{name} x{conc}")
                    n = args.requests if conc == 1 else args.requests * 4
                    row: Record = {"record": "overhead", "router": name, "concurrency": conc}
                    row |= {"prompt": args.prompt, "event_loop": "uvloop" if uvloop else "asyncio"}
                    row |= measure(
                        engine, router.url, router.pid, n, conc, args.rounds, args.prompt
                    )
                    rows.append(row)
                    print(
                        f"{name:>14} x{conc:<3}  direct p50 {row['direct_p50_ms']:6.2f} ms "
                        f"p99 {row['direct_p99_ms']:6.2f} | routed p50 {row['routed_p50_ms']:6.2f}"
                        f" p99 {row['routed_p99_ms']:6.2f} | added p50 {row['added_p50_ms']:+6.2f}"
                        f" ms, p99 {row['added_p99_ms']:+6.2f} ms | router CPU "
                        f"{_ms(row['router_cpu_ms_per_request'])} ms/request | "
                        f"{row['requests_per_s']:7.0f} requests/s",
                        flush=True,
                    )
                    bar.advance()
            finally:
                router.stop()
    got = ratios(rows)
    if got is not None:
        print(
            f"Loom: {got['loom_added_p50_ms']:.2f} ms added at the p50 (target <= 1; "
            f"sglang-router {got['sglang_router_added_p50_ms']:.2f}); CPU per request "
            f"{_x(got['cpu_per_request_over_sglang_router'])} sglang-router's (target <= 2); "
            f"requests/s at concurrency 8 {got['requests_per_s_over_sglang_router']:.2f}x "
            "sglang-router's (target >= 0.8)"
        )
        if got.get("cpu_per_request_over_floor") is not None:
            print(
                f"the floor (a bare aiohttp proxy): {got['floor_added_p50_ms']:.2f} ms added at "
                f"the p50, CPU per request {_x(got['floor_cpu_per_request_over_sglang_router'])}"
                f" sglang-router's, requests/s at 8 "
                f"{got['floor_requests_per_s_over_sglang_router']:.2f}x; Loom's CPU per request "
                f"{got['cpu_per_request_over_floor']:.2f}x the floor's"
            )
        rows.append({"record": "ratios", "prompt": args.prompt, **got})
    print(
        f"machine: {os.cpu_count()} cores; Loom's event loop: {'uvloop' if uvloop else 'asyncio'}"
        f"; prompts: {args.prompt}"
    )
    return rows


def _ms(v: float | None) -> str:
    return "under a clock tick:" if v is None else f"{v:.2f}"


def _x(v: float | None) -> str:
    return "(not measured: under a clock tick)" if v is None else f"{v:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=2000, help="routed requests per setting")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--step-ms", type=float, default=0.1)
    ap.add_argument("--prompt", choices=sorted(PROMPTS), default="text")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    ap.add_argument("--continuous", action="store_true", help="scheduling under load instead")
    ap.add_argument("--trajectories", type=int, default=400)
    ap.add_argument("--duration-s", type=float, default=120.0, help="arrivals spread over")
    ap.add_argument("--engine-running", type=int, default=8, help="continuous: each engine")
    ap.add_argument("--prefill-us-per-token", type=float, default=20.0, help="continuous")
    ap.add_argument("--repeats", type=int, default=1, help="continuous: interleaved runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--router-path", default=None, help="continuous: the router's source tree")
    args = ap.parse_args()
    if args.continuous and args.step_ms == ap.get_default("step_ms"):
        args.step_ms = 10.0
    records = continuous(args) if args.continuous else overhead(args)
    if args.json:
        doc = results("bench_rollout_router", records, seed=args.seed)
        print(f"wrote {len(records)} records to {write_results(args.json, doc)}")


if __name__ == "__main__":
    main()
