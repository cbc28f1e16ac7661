"""Agents that replay a batch through a router: each trajectory sends its context turn by turn
(prompt, earlier outputs and tool replies) asking for the turn's length, sleeps its tool
latency, and ends; over a pool of HTTP clients opened before the clock starts.

Through Loom's router the context goes as token ids with `X-Trajectory-Id` (the batch declared
first, each trajectory ended after its last turn); through a peer router, whose OpenAI route
takes text only, as text of the engine's word-level vocabulary (one word, one token) with
`X-SMG-Routing-Key`, which sglang-router's `manual` policy keeps sticky per trajectory (slime's
use)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from loom.bench.batch import VOCAB, Batch, Draws, Turn

__all__ = [
    "MODEL",
    "PER_CLIENT",
    "agent",
    "client_pool",
    "run_batch",
    "run_peer_batch",
    "vocabulary",
    "wait_fitted",
]

MODEL = "loom-tiny"  # the model vLLM's CPU engines serve (loom.runtime.engine)
# NOTE: httpcore scans every connection of its pool on each request (is_idle, has_expired):
# 512 agents on one client spent 49 CPU s of a 64 s run there. One client per 8 agents.
PER_CLIENT = 8
# NOTE: httpx's default pool holds 100 connections: beyond 100 trajectories the agents would
# queue in the client, not in the router
_UNLIMITED = httpx.Limits(max_connections=None, max_keepalive_connections=None)


@contextlib.asynccontextmanager
async def client_pool(url: str, n_agents: int) -> AsyncIterator[list[httpx.AsyncClient]]:
    """HTTP clients for `n_agents` agents, `PER_CLIENT` to a client (agent i uses client
    i // PER_CLIENT), made before the clock starts (each builds an SSL context), their
    connections opened in waves: 512 agents connecting at once overflow a server's listen
    backlog (aiohttp's is 128), and a connection the kernel dropped from it fails its first
    request (httpx.ReadError)."""
    async with contextlib.AsyncExitStack() as stack:
        pool = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, timeout=3600, limits=_UNLIMITED)
            )
            for _ in range(max(1, -(-n_agents // PER_CLIENT)))
        ]
        wave = max(1, 64 // PER_CLIENT)
        for i in range(0, len(pool), wave):
            await asyncio.gather(
                *(c.get("/health") for c in pool[i : i + wave] for _ in range(PER_CLIENT))
            )
        yield pool


async def agent(
    http: httpx.AsyncClient,
    key: str,
    turns: list[Turn],
    draws: list[list[int]],
    words: list[str] | None = None,
    sleep_scale: float = 1.0,
    model: str = MODEL,
) -> int:
    """One trajectory's turns; the tokens generated. With `words` (a peer router) the context
    goes as text: the drawn tokens as their words, the generated tokens as the text the engine
    returned (ids past the tokenizer's vocabulary, which the random model can emit,
    detokenize to nothing, so such a context can be a few tokens shorter than the token-id
    one), and the trajectory is not ended. Tool latencies are slept times `sleep_scale` (an
    emulated engine's time scale). `draws`: the prompt's and each tool reply's tokens, drawn
    before the clock starts (`loom.bench.batch.draw_tokens`)."""
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
            # the key of a peer's sticky policies: sglang-router's and smg's manual routing,
            # vllm-router's sessions
            headers = {"X-SMG-Routing-Key": key, "X-Session-ID": key}
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


async def vocabulary(engine: str, model: str = MODEL) -> list[str]:
    """Word of each token id below VOCAB of the engine's word-level tokenizer, checked to
    round-trip."""
    async with httpx.AsyncClient(base_url=engine, timeout=60) as http:
        ids = list(range(VOCAB))
        resp = await http.post("/detokenize", json={"model": model, "tokens": ids})
        words = resp.json()["prompt"].split(" ")
        back = await http.post("/tokenize", json={"model": model, "prompt": " ".join(words[3:])})
        if len(words) != VOCAB or back.json()["tokens"] != ids[3:]:
            raise RuntimeError(f"the tokenizer of {engine} is not one word per token")
    return words


def _outcome(tokens: list[int], makespan_s: float) -> dict[str, Any]:
    return {
        "makespan_s": makespan_s,
        "tokens": sum(tokens),
        "throughput_tok_s": sum(tokens) / makespan_s,
    }


async def run_peer_batch(
    url: str,
    batch: Batch,
    draws: Draws,
    words: list[str],
    scale: float = 1.0,
    model: str = MODEL,
) -> dict[str, Any]:
    """The batch through a peer router: no declaration, no end, no Loom stats. Times are
    wall seconds / `scale` (GPU seconds of emulated engines)."""
    async with client_pool(url, len(batch)) as pool:
        t0 = time.perf_counter()
        tokens = await asyncio.gather(
            *(
                agent(pool[i // PER_CLIENT], f"t{s.traj_id}", t, draws[s.traj_id], words, scale,
                      model)
                for i, (s, t) in enumerate(batch)
            )
        )  # fmt: skip
        makespan = (time.perf_counter() - t0) / scale
    return {**_outcome(tokens, makespan), "preemptions": 0, "migrations": 0, "timing": None}


async def run_batch(url: str, batch: Batch, draws: Draws, scale: float = 1.0) -> dict[str, Any]:
    """The batch through Loom's router: declared (`POST /v1/rollouts`), replayed, and the
    router's counters read after (`GET /v1/stats`: preemptions, migrations, timing). Times
    are wall seconds / `scale`."""
    async with client_pool(url, len(batch)) as pool:
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
                agent(pool[i // PER_CLIENT], f"t{s.traj_id}", turns, draws[s.traj_id], None, scale)
                for i, (s, turns) in enumerate(batch)
            )
        )
        makespan = (time.perf_counter() - t0) / scale
        stats = (await http.get("/v1/stats")).json()
    return {
        **_outcome(tokens, makespan),
        "preemptions": stats["policy"]["preemptions"],
        "timing": stats["timing"],
        "migrations": stats["policy"]["migrations"],
    }


def wait_fitted(url: str, n_hist: int, timeout_s: float = 120.0) -> bool:
    """Until the router's predictor has fitted the `n_hist` trajectories of history it was
    given (none: at once); whether it has."""
    deadline = time.monotonic() + timeout_s
    while n_hist and time.monotonic() < deadline:
        if httpx.get(url + "/v1/stats", timeout=10).json()["predictor"]["fitted"]:
            return True
        time.sleep(0.1)
    return not n_hist
