"""The replay client against real engines on loopback: through Loom's router over stand-in
engines every trajectory's turns are sent with their context grown by exactly what came
before (prompt, outputs, tool replies) and every trajectory is ended; as text (a peer's way)
against an emulated engine, the same contexts token for token."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
from bench_rig import tiny_batch

from loom.bench.batch import VOCAB, Batch, Draws, Turn, draw_tokens
from loom.bench.fleet import EmulatedEngines, StandinEngines
from loom.bench.replay import (
    PER_CLIENT,
    client_pool,
    run_batch,
    run_peer_batch,
    vocabulary,
    wait_fitted,
)
from loom.bench.routers import ThreadRouter
from loom.runtime.rollout.standin import next_token


def _expected(batch: Batch, draws: Draws) -> dict[int, list[tuple[list[int], int]]]:
    """Per trajectory, each turn's context and length: the stand-in model's output is a
    function of the context (greedy), so the whole exchange is known in advance."""
    out = {}
    for spec, turns in batch:
        context: list[int] = []
        sent = []
        for turn, drawn in zip(turns, draws[spec.traj_id], strict=True):
            context += drawn
            sent.append((list(context), turn.output_tokens))
            for _ in range(turn.output_tokens):
                context.append(next_token(context))
        out[spec.traj_id] = sent
    return out


def _logs(fleet: StandinEngines) -> list[list[dict]]:
    """Every request each engine has received."""
    return [httpx.get(url + "/debug/requests", timeout=10).json() for url in fleet.urls]


def test_every_turn_sent_with_its_context_and_every_trajectory_ended(
    standins: StandinEngines, router: ThreadRouter
) -> None:
    _, batch = tiny_batch()
    draws = draw_tokens(batch, seed=3)
    seen = [len(log) for log in _logs(standins)]
    got = asyncio.run(run_batch(router.url, batch, draws))
    expected = _expected(batch, draws)
    sent = [e for log, n in zip(_logs(standins), seen, strict=True) for e in log[n:]]
    want = Counter((tuple(ctx), n) for turns in expected.values() for ctx, n in turns)
    assert Counter((tuple(e["input_ids"]), e["max_new_tokens"]) for e in sent) == want
    assert got["tokens"] == sum(t.output_tokens for _, turns in batch for t in turns)
    assert got["makespan_s"] > 0 and got["throughput_tok_s"] == got["tokens"] / got["makespan_s"]
    assert got["preemptions"] == got["migrations"] == 0
    assert got["timing"]["turns"] == sum(len(t) for _, t in batch)
    stats = httpx.get(router.url + "/v1/stats", timeout=10).json()
    assert stats["trajectories"]["active"] == 0, "every trajectory ended"


def test_tool_calls_sleep_at_the_time_scale_and_times_are_in_its_seconds(
    router: ThreadRouter,
) -> None:
    """At a time scale of 0.1 a tool call of 10 s sleeps 1 s of wall time, and the makespan
    is wall seconds over 0.1: at least the 10 s, and under the 100 s an unscaled sleep would
    take (unless six tokens took 9 s of wall time to generate)."""
    spec = tiny_batch()[1][0][0]
    one = [(spec, [Turn(5, 3, 10.0), Turn(2, 3, None)])]
    got = asyncio.run(run_batch(router.url, one, draw_tokens(one, seed=1), scale=0.1))
    assert 10.0 <= got["makespan_s"] < 100.0


def test_a_client_per_eight_agents() -> None:
    async def pools() -> list[int]:
        with StandinEngines(1) as fleet:
            sizes = []
            for n in (1, PER_CLIENT, PER_CLIENT + 1, 3 * PER_CLIENT):
                async with client_pool(fleet.urls[0], n) as pool:
                    sizes.append(len(pool))
                    assert all(not c.is_closed for c in pool)
                assert all(c.is_closed for c in pool)
            return sizes

    assert asyncio.run(pools()) == [1, 1, 2, 3]


def test_a_router_without_history_is_fitted_at_once(router: ThreadRouter) -> None:
    assert wait_fitted(router.url, 0, timeout_s=0.0)


def test_as_text_of_the_engines_vocabulary_the_same_contexts() -> None:
    """A peer router takes text only: the agents send the words of the context's tokens,
    which the emulated engine's word-level tokenizer reads back token for token."""
    _, batch = tiny_batch()
    draws = draw_tokens(batch, seed=5)
    with EmulatedEngines("qwen3-8b@h100", 1, time_scale=0.01) as fleet:
        url = fleet.urls[0]
        model = fleet.model_name()
        words = asyncio.run(vocabulary(url, model))
        assert len(words) == VOCAB and len(set(words)) == VOCAB
        seen = len(httpx.get(url + "/debug/requests", timeout=10).json())
        got = asyncio.run(run_peer_batch(url, batch, draws, words, scale=0.01, model=model))
        log = httpx.get(url + "/debug/requests", timeout=10).json()[seen:]
    expected = _expected(batch, draws)
    want = Counter((len(ctx), n) for turns in expected.values() for ctx, n in turns)
    assert Counter((e["prompt_tokens"], e["max_tokens"]) for e in log) == want
    assert got["tokens"] == sum(t.output_tokens for _, turns in batch for t in turns)
    assert got["timing"] is None and got["preemptions"] == 0
