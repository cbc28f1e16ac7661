"""One agentic batch through the rollout router over real engines, under each rollout system:
heddle (heddle + pps), verl (cache_aware + rr), slime (least_load + rr) and verl* (hybrid +
rr); and, as a peer, through sglang-router with its own policies (`sglang:cache_aware`,
`sglang:power_of_two`, `sglang:round_robin`, `sglang:manual`) over the same engines. Reports
makespan and throughput, and their ratios against Heddle.

The batch is the workload generator's (`loom.sim.workloads.agentic`): its trajectories'
turns, output lengths and tool latencies, scaled down (`--token-scale`, `--tool-scale`,
`--max-turn-tokens`) to finish in minutes on two CPU cores. Each trajectory is an agent:
declare the batch, then per turn send the context so far (prompt, earlier outputs and tool
replies, as token ids) with `max_tokens` = the turn's length and `ignore_eos`, sleep the tool
latency, append the tool's reply, and end the trajectory after its last turn.

Engines: `--vllm N` starts N vLLM CPU engines on the tiny model (the `engine` extra),
`--standin N` N stand-in SGLang engines, or `--engine URL ...` uses running ones.

Two settings of issue 28:

* Paper scale on emulated GPUs (`--emulate qwen3-14b@h100:tp2 --engines 8`): engines that
  behave like the GPU (`loom serve engine --emulate`: the simulator's worker on a wall clock
  scaled by `--time-scale`), Heddle's batch unscaled (`--prompts 32 --samples 16`: 512
  trajectories of each of `--kinds`), tool latencies slept at the same time scale. Makespans
  are reported in GPU seconds (wall / time scale), beside the simulator's for the same batch
  (`sim_s`, the same policies on the same worker model; KV is not moved, as the router cannot),
  with the router's CPU per turn and its share of the run's CPU.
* Real vLLM CPU engines, saturated (`--vllm 2 --max-running 4 --prompts 12 --samples 4
  --repeats 5`): engines capped so that they queue, a long-tailed batch of 48 trajectories.

Run: python benchmarks/bench_rollout_runtime.py --vllm 2 [--kind coding] [--prompts 4]
     [--samples 4] [--max-running 4] [--json out.json]
     python benchmarks/bench_rollout_runtime.py --emulate qwen3-14b@h100:tp2 --engines 8
     --time-scale 0.2 [--kinds coding,search,math] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import orjson

from loom.core.trajectory import TrajectorySpec, TurnSpec, WorkloadKind
from loom.rollout.history import TrajectoryRecord, TurnRecord
from loom.rollout.history import write_history as history_file
from loom.runtime.rollout import BackgroundRouter, EngineConfig, RolloutServerConfig
from loom.runtime.rollout.config import parse_engine
from loom.runtime.rollout.prediction import HISTORY_FILE
from loom.runtime.rollout.standin import StandinProcess
from loom.sim.workloads.agentic import AgenticWorkload

# Heddle's placement cost for the vLLM CPU engines: their measured profile
TINY_PROFILE = Path(str(resources.files("loom.perf") / "data/profiles/loom-tiny_cpu-vllm_tp1.csv"))

SYSTEMS = {
    "heddle": ("heddle", "pps"),
    "verl": ("cache_aware", "rr"),
    "slime": ("least_load", "rr"),
    "verl*": ("hybrid", "rr"),
    # ablations: Heddle's placement alone, PPS alone
    "heddle-placement": ("heddle", "rr"),
    "pps-only": ("least_load", "pps"),
}

# Peers: the same batch through sglang-router (pip install sglang-router) with its own
# policies, over the same engines. Its OpenAI route takes text prompts only, so the agents
# send the context as text of the tiny model's word-level vocabulary (one word, one token)
# and X-SMG-Routing-Key, which its `manual` policy keeps sticky per trajectory (slime's use).
PEERS = {
    "sglang:cache_aware": "cache_aware",
    "sglang:power_of_two": "power_of_two",
    "sglang:round_robin": "round_robin",
    "sglang:manual": "manual",
}


@dataclass(frozen=True)
class Turn:
    input_tokens: int
    output_tokens: int
    tool_s: float | None


_UNLIMITED = httpx.Limits(max_connections=None, max_keepalive_connections=None)
# NOTE: httpx's default pool holds 100 connections: beyond 100 trajectories the agents would
# queue in the client, not in the router
_PER_CLIENT = 8
# NOTE: httpcore scans every connection of its pool on each request (is_idle, has_expired):
# 512 agents on one client spent 49 CPU s of a 64 s run there. One client per 8 agents.


@contextlib.asynccontextmanager
async def _clients(url: str, n_agents: int) -> Any:
    """HTTP clients for `n_agents` agents, `_PER_CLIENT` to a client, made before the clock
    starts (each builds an SSL context), their connections opened in waves: 512 agents
    connecting at once overflow a server's listen backlog (aiohttp's is 128), and a connection
    the kernel dropped from it fails its first request (httpx.ReadError)."""
    async with contextlib.AsyncExitStack() as stack:
        pool = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, timeout=3600, limits=_UNLIMITED)
            )
            for _ in range(max(1, -(-n_agents // _PER_CLIENT)))
        ]
        wave = max(1, 64 // _PER_CLIENT)
        for i in range(0, len(pool), wave):
            await asyncio.gather(
                *(c.get("/health") for c in pool[i : i + wave] for _ in range(_PER_CLIENT))
            )
        yield pool


def _workload(args: argparse.Namespace) -> AgenticWorkload:
    return AgenticWorkload(
        kind=WorkloadKind(args.kind),
        model="qwen3-14b",
        num_prompts=args.prompts,
        samples=args.samples,
        prompt_seed=args.seed,
    )


def scaled_batch(
    args: argparse.Namespace, epoch: int | None = None
) -> list[tuple[TrajectorySpec, list[Turn]]]:
    wl = _workload(args)
    out = []
    for spec in wl.sample(100 + args.seed if epoch is None else epoch):
        turns = [
            Turn(
                max(1, min(args.max_turn_tokens, round(t.input_tokens * args.token_scale))),
                max(1, min(args.max_turn_tokens, round(t.output_tokens * args.token_scale))),
                None if t.tool_latency_s is None else t.tool_latency_s * args.tool_scale,
            )
            for t in spec.turns[: args.max_turns]
        ]
        turns[-1] = Turn(turns[-1].input_tokens, turns[-1].output_tokens, None)
        out.append((spec, turns))
    return out


async def agent(
    http: httpx.AsyncClient,
    key: str,
    turns: list[Turn],
    draws: list[list[int]],
    words: list[str] | None = None,
    sleep_scale: float = 1.0,
    model: str = "loom-tiny",
) -> int:
    """One trajectory's turns; with `words` (a peer router) the context goes as text: the
    drawn tokens as their words, the generated tokens as the text the engine returned (ids
    past the tokenizer's vocabulary, which the random model can emit, detokenize to nothing,
    so such a context can be a few tokens shorter than the token-id one). Tool latencies are
    slept times `sleep_scale` (an emulated engine's time scale). `draws`: the prompt's and each
    tool reply's tokens, drawn before the clock starts (`draw_tokens`)."""
    context: list[int] = []
    text = ""
    generated = 0
    for turn, drawn in zip(turns, draws, strict=True):
        context += drawn
        body: dict[str, Any] = {
            "max_tokens": turn.output_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "return_token_ids": True,
        }
        if words is None:
            body["prompt"] = context
            headers = {"X-Trajectory-Id": key}
        else:
            text += "".join(" " + words[i] for i in drawn)
            body["prompt"] = text.lstrip()
            body["model"] = model
            headers = {"X-SMG-Routing-Key": key}
        headers["Content-Type"] = "application/json"
        resp = await http.post("/v1/completions", content=orjson.dumps(body), headers=headers)
        if resp.status_code != 200:
            raise RuntimeError(f"{key}: {resp.status_code} {resp.text[:500]}")
        choice = orjson.loads(resp.content)["choices"][0]
        ids = choice["token_ids"]
        if len(ids) != turn.output_tokens:
            raise RuntimeError(f"{key}: asked {turn.output_tokens} tokens, got {len(ids)}")
        context += ids
        text += choice["text"]
        generated += len(ids)
        if turn.tool_s is not None:
            await asyncio.sleep(turn.tool_s * sleep_scale)
    if words is None:
        (await http.post(f"/v1/trajectories/{key}/end")).raise_for_status()
    return generated


MODEL = "loom-tiny"
VOCAB = 500  # agents draw prompt and tool tokens from ids 3..VOCAB-1


def _rng(seed: int, spec: TrajectorySpec) -> random.Random:
    """The agent's draws of prompt and tool tokens: the same through every router."""
    return random.Random(seed * 7919 + spec.traj_id)


Draws = dict[int, list[list[int]]]


def draw_tokens(batch: list[tuple[TrajectorySpec, list[Turn]]], seed: int) -> Draws:
    """Each trajectory's prompt and tool-reply tokens, per turn, drawn once before any run:
    at paper scale they are millions of tokens, whose drawing inside a run would charge the
    agents' CPU to the makespan."""
    out: Draws = {}
    for spec, turns in batch:
        rng = _rng(seed, spec)
        out[spec.traj_id] = [
            [rng.randrange(3, VOCAB) for _ in range(t.input_tokens)] for t in turns
        ]
    return out


async def vocabulary(engine: str, model: str = MODEL) -> list[str]:
    """Word of each token id of the engine's word-level tokenizer, checked to round-trip."""
    async with httpx.AsyncClient(base_url=engine, timeout=60) as http:
        ids = list(range(VOCAB))
        resp = await http.post("/detokenize", json={"model": model, "tokens": ids})
        words = resp.json()["prompt"].split(" ")
        back = await http.post("/tokenize", json={"model": model, "prompt": " ".join(words[3:])})
        if len(words) != VOCAB or back.json()["tokens"] != ids[3:]:
            raise RuntimeError("the engine's tokenizer is not one word per token")
    return words


async def run_peer_batch(
    url: str,
    batch: list[tuple[TrajectorySpec, list[Turn]]],
    draws: Draws,
    words: list[str],
    scale: float = 1.0,
    model: str = MODEL,
) -> dict:
    """The batch through a peer router: no declaration, no end, no Loom stats. Times are
    wall seconds / `scale` (GPU seconds of emulated engines)."""
    async with _clients(url, len(batch)) as pool:
        t0 = time.perf_counter()
        tokens = await asyncio.gather(
            *(
                agent(pool[i // _PER_CLIENT], f"t{s.traj_id}", t, draws[s.traj_id], words, scale,
                      model)
                for i, (s, t) in enumerate(batch)
            )
        )  # fmt: skip
        makespan = (time.perf_counter() - t0) / scale
    return {
        "makespan_s": makespan,
        "tokens": sum(tokens),
        "throughput_tok_s": sum(tokens) / makespan,
        "preemptions": 0,
        "migrations": 0,
        "timing": None,
    }


async def run_batch(
    url: str, batch: list[tuple[TrajectorySpec, list[Turn]]], draws: Draws, scale: float = 1.0
) -> dict:
    async with _clients(url, len(batch)) as pool:
        http = pool[0]
        declared = [
            {
                "id": f"t{s.traj_id}",
                "prompt_id": s.prompt_id,
                "prompt_tokens": turns[0].input_tokens,
            }
            for s, turns in batch
        ]
        (await http.post("/v1/rollouts", json={"trajectories": declared})).raise_for_status()
        t0 = time.perf_counter()
        tokens = await asyncio.gather(
            *(
                agent(pool[i // _PER_CLIENT], f"t{s.traj_id}", turns, draws[s.traj_id], None, scale)
                for i, (s, turns) in enumerate(batch)
            )
        )
        makespan = (time.perf_counter() - t0) / scale
        stats = (await http.get("/v1/stats")).json()
    return {
        "makespan_s": makespan,
        "tokens": sum(tokens),
        "throughput_tok_s": sum(tokens) / makespan,
        "preemptions": stats["policy"]["preemptions"],
        "timing": stats["timing"],
        "migrations": stats["policy"]["migrations"],
    }


def write_history(args: argparse.Namespace, state_dir: Path) -> int:
    """Earlier epochs of the same prompts, scaled like the batch, as the router's history:
    its predictor starts fitted, as Heddle's is after the first steps of training."""
    records = []
    for epoch in range(args.history):
        for spec, turns in scaled_batch(args, epoch):
            records.append(
                TrajectoryRecord(
                    trajectory_id=f"h{epoch}-{spec.traj_id}",
                    prompt_id=str(spec.prompt_id),
                    prompt_features=(float(turns[0].input_tokens),),
                    turns=tuple(
                        TurnRecord(
                            input_tokens=t.input_tokens,
                            output_tokens=t.output_tokens,
                            tool_latency_s=t.tool_s,
                        )
                        for t in turns
                    ),
                )
            )
    state_dir.mkdir(parents=True, exist_ok=True)
    return history_file(state_dir / HISTORY_FILE, records)


def cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by each class of process on this machine (psutil, which vLLM
    installs): where two cores go during a run. A router in a process of its own exits with
    its run: `run_system` counts it (`router_cpu_s`) while it lives."""
    import psutil

    me = os.getpid()
    used: dict[str, float] = {}
    for proc in psutil.process_iter(["name", "cmdline", "pid"]):
        try:
            times = proc.cpu_times()
            name, cmd = proc.info["name"] or "", " ".join(proc.info["cmdline"] or ())
        except psutil.Error:
            continue
        if proc.info["pid"] == me:
            kind = "agents (and Loom's router with --in-process)"
        elif name.startswith("VLLM::Worker"):
            kind = "vLLM model workers"
        elif name.startswith("VLLM::EngineCor"):
            kind = "vLLM engine cores (scheduler)"
        elif "vllm.entrypoints" in cmd:
            kind = "vLLM API servers"
        else:
            kind = "other"
        used[kind] = used.get(kind, 0.0) + times.user + times.system
    return used


def per_turn(timing: dict[str, float] | None) -> str:
    if timing is None:
        return "-"
    n = max(1, timing["turns"])
    return (
        f"queue {timing['queue_s'] / n:.3f} s, first token {timing['first_token_s'] / n:.3f} s, "
        f"decode {timing['decode_s'] / n:.3f} s"
    )


def run_system(
    args: argparse.Namespace,
    name: str,
    urls: list[str],
    batch: list[tuple[TrajectorySpec, list[Turn]]],
    tmp: Path,
    n_hist: int,
) -> dict[str, Any]:
    """One run of the batch through a fresh router configured as system `name`."""
    scale = args.time_scale if args.emulate else 1.0
    draws = _draws(args, batch)
    if name in PEERS:
        from bench_rollout_router import sglang_router

        words = asyncio.run(vocabulary(urls[0], args.model_name))
        with sglang_router(*urls, policy=PEERS[name]) as peer:
            if peer is None:
                raise SystemExit(f"{name} needs sglang-router: pip install sglang-router")
            with _cpu_of(peer[1]) as used, _cpu_window(args) as window:
                row = asyncio.run(
                    run_peer_batch(peer[0], batch, draws, words, scale, args.model_name)
                )
            return {"system": name, **row, "router_cpu_s": used(), **window}
    placement, scheduler = SYSTEMS[name]
    state = Path(tempfile.mkdtemp(dir=tmp))
    if n_hist:
        (state / HISTORY_FILE).write_bytes((tmp / HISTORY_FILE).read_bytes())
    profiles = (TINY_PROFILE,) if (args.vllm or args.simulate) and not args.emulate else ()
    engine_opts = f"max_running={args.max_running}"
    if args.engine_queue:  # turns beyond the cap that wait in the engine's own queue
        engine_opts += f",queue={args.engine_queue}"
    if args.emulate:  # the GPU's degree for Heddle's placement; the key as vLLM's priority
        engine_opts += f",tp={_spec(args).tp},priority"
    if args.in_process:
        cfg = RolloutServerConfig(
            port=0,
            placement=placement,
            scheduler=scheduler,
            profiles=profiles,
            state_dir=state if n_hist else None,
            engines=tuple(
                EngineConfig.model_validate(parse_engine(f"{u},{engine_opts}")) for u in urls
            ),
            **_cost_model(args),
        )
        with BackgroundRouter(cfg) as router:
            _wait_fitted(router.url, n_hist)
            with _cpu_window(args) as window:
                row = asyncio.run(run_batch(router.url, batch, draws, scale))
            return {"system": name, **row, **window}
    # As users run it, and as the peer runs: a process of its own.
    from bench_rollout_router import _free_port, _process

    port = _free_port()
    cmd = [sys.executable, "-m", "loom.cli", "serve", "rollout", "--port", str(port)]
    cmd += ["--placement", placement, "--scheduler", scheduler, "--state-dir", str(state)]
    for url in urls:
        cmd += ["--engine", f"{url},{engine_opts}"]
    for profile in profiles:
        cmd += ["--profile", str(profile)]
    cfg = _cost_model(args)
    if cfg:
        cmd += ["--config", str(_write_config(tmp, cfg))]
    url = f"http://127.0.0.1:{port}"
    with _process(cmd, url, "/health") as proc:
        _wait_fitted(url, n_hist)
        with _cpu_of(proc.pid) as used, _cpu_window(args) as window:
            row = asyncio.run(run_batch(url, batch, draws, scale))
        return {"system": name, **row, "router_cpu_s": used(), **window}


@contextlib.contextmanager
def _cpu_window(args: argparse.Namespace) -> Iterator[dict[str, float]]:
    """CPU seconds the engines (emulated ones) and this process (the agents) use inside the
    block, and its wall seconds; filled in when the block ends."""
    pids = getattr(args, "engine_pids", [])
    out: dict[str, Any] = {}
    stats0 = _engine_stats(args)
    engines0, own0, t0 = _process_cpu(pids), _own_cpu(), time.perf_counter()
    yield out
    out["wall_s"] = time.perf_counter() - t0
    out["engines_cpu_s"] = _process_cpu(pids) - engines0
    out["agents_cpu_s"] = _own_cpu() - own0
    stats = _engine_stats(args)
    out["engine"] = {k: stats[k] - stats0.get(k, 0) for k in stats}


_ENGINE_COUNTS = ("preemptions", "prefill_tokens", "cached_hit_tokens", "busy_s")


def _engine_stats(args: argparse.Namespace) -> dict[str, float]:
    """Emulated engines' counters, summed: preemptions, tokens prefilled and found cached,
    GPU-busy seconds."""
    urls = getattr(args, "engine_urls", [])
    total = dict.fromkeys(_ENGINE_COUNTS, 0.0)
    for url in urls:
        got = httpx.get(url + "/debug/stats", timeout=30).json()
        for k in _ENGINE_COUNTS:
            total[k] += got[k]
    return total


def _draws(args: argparse.Namespace, batch: list[tuple[TrajectorySpec, list[Turn]]]) -> Draws:
    """The batch's drawn tokens, drawn on its first run and kept for the others."""
    key = (args.kind, len(batch))
    cache = args.__dict__.setdefault("draw_cache", {})
    if key not in cache:
        cache.clear()  # one workload at a time: a paper-scale one is millions of tokens
        cache[key] = draw_tokens(batch, args.seed)
    return cache[key]


def _spec(args: argparse.Namespace) -> Any:
    from loom.runtime.emulate import EmulationSpec

    return EmulationSpec.parse(args.emulate)


def _cost_model(args: argparse.Namespace) -> dict[str, Any]:
    """Heddle's placement plans with the roofline of the emulated GPU; and the router
    settings given with --router-set (ablations)."""
    out: dict[str, Any] = dict(args.router_set)
    if args.emulate:
        spec = _spec(args)
        out |= {"model": spec.model, "gpu": spec.gpu.value}
    return out


# the router settings each system and setting of the benchmark sets itself
_BENCH_SETS = {
    "placement",
    "scheduler",
    "engines",
    "profiles",
    "model",
    "gpu",
    "port",
    "host",
    "state_dir",
}


def _router_setting(text: str) -> tuple[str, Any]:
    """KEY=VALUE for --router-set: VALUE as JSON where it parses (numbers, true), else text;
    KEY must be one of the router's settings, and not one the benchmark sets itself."""
    key, eq, value = text.partition("=")
    if not eq or key not in RolloutServerConfig.model_fields:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected KEY=VALUE with KEY one of the router's settings "
            f"(loom serve rollout --config), e.g. refit_every=100000"
        )
    if key in _BENCH_SETS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the benchmark sets {key} itself (for a system, --systems)"
        )
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _write_config(tmp: Path, values: dict[str, Any]) -> Path:
    path = tmp / "router.json"
    path.write_text(json.dumps(values))
    return path


@contextlib.contextmanager
def _cpu_of(pid: int) -> Iterator[Callable[[], float]]:
    """CPU seconds process `pid` used inside the block (read once it has ended)."""
    import psutil

    proc = psutil.Process(pid)
    t0 = sum(proc.cpu_times()[:2])
    spent: list[float] = []
    yield lambda: spent[0]
    spent.append(sum(proc.cpu_times()[:2]) - t0)


def _wait_fitted(url: str, n_hist: int, timeout_s: float = 120.0) -> None:
    """Until the router's predictor has fitted the history it was given."""
    deadline = time.monotonic() + timeout_s
    while n_hist and time.monotonic() < deadline:
        if httpx.get(url + "/v1/stats", timeout=10).json()["predictor"]["fitted"]:
            return
        time.sleep(0.1)


def to_spec(spec: TrajectorySpec, turns: list[Turn]) -> TrajectorySpec:
    """The scaled trajectory as the simulator takes it; its prompt feature is what the
    router's predictor sees (the prompt's tokens)."""
    return TrajectorySpec(
        traj_id=spec.traj_id,
        prompt_id=spec.prompt_id,
        sample_idx=spec.sample_idx,
        workload=None,
        turns=tuple(TurnSpec(t.input_tokens, t.output_tokens, t.tool_s) for t in turns),
        prompt_features=(float(turns[0].input_tokens),),
    )


async def _timed_stream(http: httpx.AsyncClient, url: str, prompt: list[int], n: int) -> tuple:
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
    assert first is not None
    return first - t0, (end - first) / max(1, n - 1)


async def calibrate(urls: list[str], max_running: int) -> list[tuple[int, int, int, int, float]]:
    """Profile rows of the engines as the router uses them, end to end (HTTP streaming, the
    API server's per-token work, every engine busy at once as in the batch): decode steps at
    batch 1..max_running, prefills of 64..2048 tokens."""
    rng = random.Random(0)
    rows: list[tuple[int, int, int, int, float]] = []
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


def simulate(
    args: argparse.Namespace,
    name: str,
    batch: list[tuple[TrajectorySpec, list[Turn]]],
    n_engines: int,
    profile: Path = TINY_PROFILE,
) -> float:
    """The same batch in Loom's rollout simulator, its engines modelled by the measured
    profile of the vLLM CPU engine, the same policies and the same admission cap; the
    router's predictor fitted on the same history. Migration recomputes the prefix there
    as it does here (no KV moves)."""
    from loom.perf.latency import ProfiledLatencyModel
    from loom.rollout.heddle.predictor import ProgressivePredictor
    from loom.rollout.policy import SCHEDULERS, WorkerLayout
    from loom.runtime.rollout.driver import make_router
    from loom.sim.rollout.simulator import RolloutConfig, RolloutSimulator

    placement, scheduler = SYSTEMS[name]
    specs = [to_spec(s, t) for s, t in batch]
    history = [to_spec(s, t) for e in range(args.history) for s, t in scaled_batch(args, e)]
    predictions = ProgressivePredictor().fit(history).predict_steps(specs) if history else None
    settings = RolloutServerConfig(
        placement=placement,
        scheduler=scheduler,
        profiles=(profile,),
        engines=tuple(
            EngineConfig(url=f"http://sim{i}", max_running=args.max_running)
            for i in range(n_engines)
        ),
        **dict(args.router_set),
    )
    latency = ProfiledLatencyModel.load(profile)
    sim = RolloutSimulator(
        specs,
        WorkerLayout(degrees=(1,) * n_engines),
        SCHEDULERS.get(scheduler)(),
        make_router(settings, history=history),
        RolloutConfig(
            max_running=args.max_running,
            decode_reserve=args.max_turn_tokens,
            migrate_kv=False,
            gate_moves=True,
        ),
        predictions=predictions,
        latency=lambda tp: latency,
    )
    return sim.run().makespan_s


def simulate_emulated(
    args: argparse.Namespace,
    name: str,
    batch: list[tuple[TrajectorySpec, list[Turn]]],
    dispatch_s: float = 0.0,
    decision_s: float = 0.0,
) -> Any:
    """The same batch in Loom's rollout simulator on the worker model the emulated engines
    run (the roofline of the emulated GPU, the engines' settings), under system `name`'s
    policies inside the workers, as `loom reproduce heddle` runs them; the router's predictor
    fitted on the same history. KV caches do not move (the router cannot move them).
    `dispatch_s`: GPU seconds from a turn being ready to the router (the simulator's
    `dispatch_delay_s`: the HTTP round trips); `decision_s`: the router's GPU seconds per turn,
    one turn at a time (`router_decision_s`)."""
    from loom.rollout.heddle.predictor import ProgressivePredictor
    from loom.rollout.policy import SCHEDULERS, WorkerLayout
    from loom.runtime.rollout.driver import make_router
    from loom.sim.rollout.simulator import RolloutConfig, RolloutSimulator

    spec = _spec(args)
    placement, scheduler = SYSTEMS[name]
    specs = [to_spec(s, t) for s, t in batch]
    history = [to_spec(s, t) for e in range(args.history) for s, t in scaled_batch(args, e)]
    predictions = ProgressivePredictor().fit(history).predict_steps(specs) if history else None
    settings = RolloutServerConfig(
        placement=placement,
        scheduler=scheduler,
        model=spec.model,
        gpu=spec.gpu.value,
        engines=tuple(
            EngineConfig(url=f"http://sim{i}", max_running=args.max_running, tp=spec.tp)
            for i in range(args.engines)
        ),
        **dict(args.router_set),
    )
    sim = RolloutSimulator(
        specs,
        WorkerLayout(degrees=(spec.tp,) * args.engines),
        SCHEDULERS.get(scheduler)(),
        make_router(settings, history=history),
        RolloutConfig(
            model=spec.model,
            gpu=spec.gpu,
            max_running=args.engine_max_running,
            migrate_kv=False,
            gate_moves=True,  # the router's moves pay for their prefill, as it decides them
            dispatch_delay_s=dispatch_s,
            router_decision_s=decision_s,
        ),
        predictions=predictions,
    )
    return sim.run()


@contextlib.contextmanager
def engines(args: argparse.Namespace) -> Iterator[list[str]]:
    if args.engine:
        yield args.engine
        return
    with contextlib.ExitStack() as stack:
        if args.emulate:
            from loom.runtime.emulate import EmulatedProcess

            flags = ["--time-scale", str(args.time_scale), "--max-running",
                     str(args.engine_max_running), "--stream-interval-ms",
                     str(args.stream_interval_ms)]  # fmt: skip
            procs = [
                stack.enter_context(EmulatedProcess(args.emulate, *flags))
                for _ in range(args.engines)
            ]
            args.engine_pids = [p.pid for p in procs]
            args.engine_urls = [p.url for p in procs]
            yield [p.url for p in procs]
            return
        if args.vllm:
            from loom.runtime.engine import EnginePool

            # each engine's compute threads on a core of its own, as on separate GPUs
            pool = stack.enter_context(EnginePool(limit=args.vllm, max_running=args.max_running))
            urls = [engine.url for engine in pool.get(args.vllm)]
        else:
            urls = [
                stack.enter_context(StandinProcess("--step-ms", "5")).url
                for _ in range(args.standin)
            ]
        yield urls


def _process_cpu(pids: list[int]) -> float:
    """User + system CPU seconds of processes `pids` and their children so far."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in (proc, *proc.children(recursive=True)):
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            continue
    return total


def _round_trip_s(url: str, n: int = 50) -> float:
    """Median wall seconds of an HTTP round trip on loopback (a GET of /health)."""
    times = []
    with httpx.Client(base_url=url, timeout=30) as http:
        for _ in range(n):
            t0 = time.perf_counter()
            http.get("/health").raise_for_status()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def main_emulated(args: argparse.Namespace) -> None:
    """Issue 28's paper-scale setting: every workload of `--kinds`, each Loom system and each
    peer run `--repeats` times, interleaved, over the same emulated engines; the simulator's
    makespan of the same batch beside each Loom system's."""
    from bench_rollout_router import _wait

    systems = [s for s in args.systems.split(",") if s]
    peers = [s for s in args.peers.split(",") if s]
    rows: list[dict[str, Any]] = []
    with engines(args) as urls, tempfile.TemporaryDirectory() as tmp:
        for url in urls:
            _wait(url, "/health")
        args.model_name = httpx.get(urls[0] + "/v1/models", timeout=30).json()["data"][0]["id"]
        rtt = _round_trip_s(urls[0])
        print(
            f"{len(urls)} emulated engines {args.emulate}, time scale {args.time_scale:g}; "
            f"HTTP round trip on loopback {1e3 * rtt:.2f} ms wall"
        )
        for kind in args.kinds.split(","):
            args.kind = kind
            batch = scaled_batch(args)
            n_turns = sum(len(t) for _, t in batch)
            n_tokens = sum(x.output_tokens for _, t in batch for x in t)
            print(f"{kind}: {len(batch)} trajectories, {n_turns} turns, {n_tokens} output tokens")
            work = Path(tmp) / kind
            work.mkdir()
            n_hist = write_history(args, work) if args.history else 0
            sims = {name: simulate_emulated(args, name, batch) for name in systems}
            for name, res in sims.items():
                print(
                    f"  simulated {name:>8}: {res.makespan_s:8.1f} s, preemptions "
                    f"{res.preemptions}, prefilled {res.prefill_tokens}, cached "
                    f"{res.cache_hit_tokens}, migrations {res.migrations}",
                    flush=True,
                )
            runs: dict[str, list[dict[str, Any]]] = {}
            for rep in range(args.repeats):  # systems interleaved: drift hits all alike
                for name in systems + peers:
                    row = run_system(args, name, urls, batch, work, n_hist)
                    row["turns"] = n_turns
                    runs.setdefault(name, []).append(row)
                    router = row.get("router_cpu_s", 0.0)
                    total = router + row["engines_cpu_s"] + row["agents_cpu_s"]
                    print(
                        f"  {name:>19} #{rep}: makespan {row['makespan_s']:7.1f} s "
                        f"(wall {row['wall_s']:.0f} s), preemptions {row['preemptions']}, "
                        f"router CPU {1e3 * router / n_turns:.2f} ms/turn "
                        f"({100 * router / max(total, 1e-9):.0f}% of the run's "
                        f"{total:.1f} CPU s: engines {row['engines_cpu_s']:.1f}, agents "
                        f"{row['agents_cpu_s']:.1f}); per turn: {per_turn(row['timing'])}; "
                        "engines: " + ", ".join(f"{k} {v:.0f}" for k, v in row["engine"].items()),
                        flush=True,
                    )
            for name, got in runs.items():
                spans = [r["makespan_s"] for r in got]
                router = [r.get("router_cpu_s", 0.0) for r in got]
                totals = [
                    r.get("router_cpu_s", 0.0) + r["engines_cpu_s"] + r["agents_cpu_s"] for r in got
                ]
                row = {
                    "workload": kind,
                    "system": name,
                    "makespan_s": statistics.median(spans),
                    "makespan_runs_s": spans,
                    "spread": (max(spans) - min(spans)) / statistics.median(spans),
                    "preemptions": statistics.median(r["preemptions"] for r in got),
                    "router_cpu_ms_per_turn": 1e3 * statistics.median(router) / n_turns,
                    "router_cpu_share": statistics.median(
                        a / max(b, 1e-9) for a, b in zip(router, totals, strict=True)
                    ),
                    "run_cpu_s": statistics.median(totals),
                    "wall_s": statistics.median(r["wall_s"] for r in got),
                }
                if name in sims:
                    row["sim_s"] = sims[name].makespan_s
                    row["real_over_sim"] = row["makespan_s"] / row["sim_s"]
                    # the served router: its CPU per turn, spent one turn at a time (one event
                    # loop), and two round trips (agent to router, router to engine) per turn;
                    # wall seconds, in GPU seconds
                    decision = statistics.median(router) / n_turns / args.time_scale
                    routed = simulate_emulated(
                        args, name, batch, 2 * rtt / args.time_scale, decision
                    )
                    row["sim_decision_s"] = decision
                    row["sim_routed_s"] = routed.makespan_s
                    row["real_over_sim_routed"] = row["makespan_s"] / routed.makespan_s
                rows.append(row)
            _report(kind, [r for r in rows if r["workload"] == kind], peers)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def _report(kind: str, rows: list[dict[str, Any]], peers: list[str]) -> None:
    by = {r["system"]: r for r in rows}
    h_span = by["heddle"]["makespan_s"] if "heddle" in by else None
    print(
        f"{kind}: median makespan (GPU s), spread (max-min)/median, makespan / heddle's, "
        "real/simulated:"
    )
    for r in rows:
        if h_span is not None:
            r["vs_heddle"] = r["makespan_s"] / h_span
        sim = ""
        if "sim_s" in r:
            sim = (
                f", sim {r['sim_s']:.1f} s, real/sim {r['real_over_sim']:.3f}; with the router's "
                f"{r['sim_decision_s']:.3f} s/turn: sim {r['sim_routed_s']:.1f} s, real/sim "
                f"{r['real_over_sim_routed']:.3f}"
            )
        print(
            f"  {r['system']:>19}: {r['makespan_s']:8.1f} s (spread {100 * r['spread']:.1f}%), "
            f"x{r.get('vs_heddle', float('nan')):.3f}{sim}; router "
            f"{r['router_cpu_ms_per_turn']:.2f} ms CPU/turn, "
            f"{100 * r['router_cpu_share']:.1f}% of the run's CPU"
        )
    if "heddle" not in by:
        return
    h = by["heddle"]["makespan_s"]
    base = [by[s]["makespan_s"] for s in ("verl", "slime", "verl*") if s in by]
    peer = [by[s]["makespan_s"] for s in peers if s in by]
    if base:
        print(f"  best of verl/slime/verl* / heddle: {min(base) / h:.3f} (target >= 1.2)")
    if peer:
        print(f"  best sglang-router policy / heddle: {min(peer) / h:.3f} (target >= 1.3)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--engine", nargs="*", default=None, help="running engines' URLs")
    ap.add_argument("--vllm", type=int, default=0, help="start this many vLLM CPU engines")
    ap.add_argument(
        "--simulate",
        action="store_true",
        help="with --engine: they are `loom serve engine`s; profile and simulate them too "
        "(always with --vllm)",
    )
    ap.add_argument("--standin", type=int, default=2, help="else this many stand-in engines")
    ap.add_argument("--kind", default="coding", choices=[k.value for k in WorkloadKind])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--token-scale", type=float, default=0.05)
    ap.add_argument("--tool-scale", type=float, default=0.05)
    ap.add_argument("--max-turn-tokens", type=int, default=256)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--max-running", type=int, default=4, help="turns in flight per engine")
    ap.add_argument("--systems", default="heddle,verl,slime,verl*")
    ap.add_argument(
        "--engine-queue",
        type=int,
        default=0,
        help="Loom's engines' `queue`: turns sent beyond --max-running to wait in the engine",
    )
    ap.add_argument(
        "--history", type=int, default=3, help="earlier epochs the predictor learns from first"
    )
    ap.add_argument("--repeats", type=int, default=3, help="runs per system; medians reported")
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="run Loom's router in this process (a thread) rather than a process of its own",
    )
    ap.add_argument(
        "--cpu", action="store_true", help="report CPU seconds by process class for each run"
    )
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--router-set",
        type=_router_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of Loom's router for every Loom system (repeatable; an ablation, "
        "e.g. refit_every=100000 or max_preemptions=0); the simulation of a system sees the "
        "settings its router's policies read (placement parameters), not the driver's",
    )
    emu = ap.add_argument_group("paper scale on emulated GPUs")
    emu.add_argument("--emulate", default=None, help="MODEL@GPU[:tpN], e.g. qwen3-14b@h100:tp2")
    emu.add_argument("--engines", type=int, default=8, help="emulated engines")
    emu.add_argument("--time-scale", type=float, default=0.2, help="wall s per GPU s")
    emu.add_argument("--kinds", default="coding,search,math", help="workloads, in turn")
    emu.add_argument(
        "--engine-max-running", type=int, default=1024, help="each engine's own max_num_seqs"
    )
    emu.add_argument(
        "--stream-interval-ms", type=float, default=250.0, help="wall ms between stream chunks"
    )
    emu.add_argument(
        "--peers",
        default="sglang:cache_aware,sglang:power_of_two,sglang:round_robin,sglang:manual",
        help="sglang-router policies over the same engines ('' for none)",
    )
    if "--emulate" in sys.argv[1:]:  # paper scale: Heddle's batch unscaled
        ap.set_defaults(
            prompts=32, samples=16, token_scale=1.0, tool_scale=1.0, max_turn_tokens=10**9,
            max_turns=48, max_running=1024,
        )  # fmt: skip
    args = ap.parse_args()
    if args.emulate:
        return main_emulated(args)
    batch = scaled_batch(args)
    n_turns = sum(len(t) for _, t in batch)
    n_tokens = sum(x.output_tokens for _, t in batch for x in t)
    print(
        f"batch: {len(batch)} trajectories, {n_turns} turns, {n_tokens} output tokens", flush=True
    )
    rows: list[dict[str, Any]] = []
    with engines(args) as urls, tempfile.TemporaryDirectory() as tmp:
        # the model's name as the engines serve it (a peer router's requests must name it)
        args.model_name = httpx.get(urls[0] + "/v1/models", timeout=30).json()["data"][0]["id"]
        n_hist = write_history(args, Path(tmp)) if args.history else 0
        print(f"history: {n_hist} trajectories from {args.history} earlier epochs")
        runs: dict[str, list[dict[str, Any]]] = {}
        for rep in range(args.repeats):  # systems interleaved: drift hits all alike
            for name in args.systems.split(","):
                before = cpu_seconds() if args.cpu else {}
                row = run_system(args, name, urls, batch, Path(tmp), n_hist)
                if args.cpu:
                    after = cpu_seconds()
                    row["cpu_s"] = {k: v - before.get(k, 0.0) for k, v in after.items()}
                    if "router_cpu_s" in row:
                        row["cpu_s"]["router"] = row["router_cpu_s"]
                    print(
                        f"{name:>16} #{rep}: CPU seconds over {row['makespan_s']:.1f} s of "
                        f"{os.cpu_count()} cores: "
                        + ", ".join(f"{k} {v:.1f}" for k, v in row["cpu_s"].items() if v > 0.05)
                    )
                runs.setdefault(name, []).append(row)
                print(
                    f"{name:>16} #{rep}: makespan {row['makespan_s']:7.1f} s, "
                    f"{row['throughput_tok_s']:7.1f} tok/s, preemptions {row['preemptions']}, "
                    f"migrations {row['migrations']}; per turn: {per_turn(row['timing'])}",
                    flush=True,
                )
        for name, got in runs.items():
            spans = [r["makespan_s"] for r in got]
            rows.append(
                {
                    "system": name,
                    "makespan_s": statistics.median(spans),
                    "makespan_runs_s": spans,
                    "throughput_tok_s": statistics.median(r["throughput_tok_s"] for r in got),
                    "preemptions": statistics.median(r["preemptions"] for r in got),
                    "migrations": statistics.median(r["migrations"] for r in got),
                }
            )
        if args.vllm or args.simulate:  # the simulator against the same engines, as served
            from loom.perf.latency import ProfiledLatencyModel, save_profile

            calib = asyncio.run(calibrate(urls, args.max_running))
            served = Path(tmp) / "served_tp1.csv"
            kv = ProfiledLatencyModel.load(TINY_PROFILE).kv_capacity_tokens
            note = "end-to-end calibration by bench_rollout_runtime.py (streamed, all engines busy)"
            save_profile(served, calib, tp=1, kv_capacity_tokens=kv, note=note)
            print("served profile (decode_batch, context, prefill, prefill_ctx, s):", calib)
            for row in rows:
                if row["system"] in PEERS:
                    continue
                row["sim_makespan_s"] = simulate(args, row["system"], batch, len(urls), served)
                row["sim_over_real"] = row["sim_makespan_s"] / row["makespan_s"]
                print(
                    f"{row['system']:>16}: simulated {row['sim_makespan_s']:6.1f} s, real "
                    f"(median) {row['makespan_s']:6.1f} s, sim/real {row['sim_over_real']:.3f}"
                )
    base = next((r for r in rows if r["system"] == "heddle"), None)
    if base is not None:
        for r in rows:
            r["makespan_vs_heddle"] = r["makespan_s"] / base["makespan_s"]
        print(
            "median makespan / heddle's (above 1: slower than heddle):",
            ", ".join(f"{r['system']} {r['makespan_vs_heddle']:.3f}" for r in rows),
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
