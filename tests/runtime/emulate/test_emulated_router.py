"""Loom's router in front of emulated GPU engines, as in front of vLLM: a multi-turn
trajectory with logprobs, preemption with an exact resume (found in the engine's prefix
cache), the scheduler's key passed as the engine's priority, an abort, and a trajectory that
moves between engines with its KV cache."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from across import Across
from emulated_batch import reference

from loom.runtime.emulate import EmulatedProcess
from loom.runtime.rollout import BackgroundRouter, EngineConfig, RolloutServerConfig
from loom.runtime.rollout.driver import RolloutDriver

SPEC = "qwen3-14b@h100:tp2"


@pytest.fixture(scope="module")
def engines() -> Iterator[list[EmulatedProcess]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(EmulatedProcess(SPEC, "--time-scale", "0.3")) for _ in range(2)]


@contextlib.contextmanager
def serve(engines: list[EmulatedProcess], max_running: int = 8, **settings: object):
    cfg = RolloutServerConfig(
        port=0,
        engines=tuple(
            EngineConfig(url=e.url, max_running=max_running, priority=True) for e in engines
        ),
        **settings,  # type: ignore[arg-type]
    )
    with BackgroundRouter(cfg) as r, httpx.Client(base_url=r.url, timeout=300) as http:
        yield http


def complete(http: httpx.Client, key: str, prompt: list[int], n: int, **extra: object) -> dict:
    body = {"prompt": prompt, "max_tokens": n, "ignore_eos": True, "return_token_ids": True}
    resp = http.post("/v1/completions", json={**body, **extra}, headers={"X-Trajectory-Id": key})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]


def log(engine: EmulatedProcess) -> list[dict]:
    return httpx.get(engine.url + "/debug/requests", timeout=10).json()


def test_a_trajectory_with_logprobs_and_the_engines_prefix_cache(engines) -> None:
    with serve(engines, placement="cache_aware", scheduler="fcfs") as http:
        ctx = list(range(100, 140))
        for step in range(3):
            choice = complete(http, "t", ctx, 50, logprobs=1)
            assert (choice["token_ids"], choice["logprobs"]["token_logprobs"]) == reference(ctx, 50)
            ctx += choice["token_ids"] + [7 + step] * 20  # a tool's reply
        http.post("/v1/trajectories/t/end")
    mine = [r for e in engines for r in log(e) if r["prompt_tokens"] >= 40 and r["rid"][0] != "x"]
    turns = sorted(mine, key=lambda r: r["arrival_s"])[-3:]
    # pinned to one engine, each later turn found the earlier context cached there
    assert [r["cached_tokens"] for r in turns[1:]] == [90, 160]


def test_preemption_resumes_exactly_from_the_engines_cache(engines) -> None:
    """PPS with one turn at a time: a fresh turn outranks a long one, which the router aborts
    at the engine and resumes later with prompt + generated; the tokens and logprobs are those
    of an uninterrupted turn, and the engine finds the interrupted context cached."""
    n = 3000  # about 25 s on the emulated GPU, 7 s of wall time
    prompt = [11] * 40
    with serve(engines[:1], max_running=1, placement="least_load", scheduler="pps") as http:
        complete(http, "long", [12] * 20, 4)  # a first turn: PPS ranks its next one by it
        out: dict = {}
        worker = threading.Thread(
            target=lambda: out.update(complete(http, "long", prompt, n, logprobs=0))
        )
        worker.start()
        deadline = time.monotonic() + 60
        while http.get("/v1/stats").json()["engines"]["e0"]["tokens"] < 4 + 20:
            assert time.monotonic() < deadline, "the long turn never decoded"
            time.sleep(0.02)
        fresh = complete(http, "fresh", [13] * 30, 6)
        worker.join(300)
        stats = http.get("/v1/stats").json()
        for key in ("long", "fresh"):
            http.post(f"/v1/trajectories/{key}/end")
    assert stats["policy"]["preemptions"] >= 1 and len(fresh["token_ids"]) == 6
    assert (out["token_ids"], out["logprobs"]["token_logprobs"]) == reference(prompt, n)
    long_turns = [r for r in log(engines[0]) if r["prompt_tokens"] >= 40 and r["max_tokens"] > 6]
    first, resumed = sorted(long_turns, key=lambda r: r["arrival_s"])[-2:]
    assert first["finish_reason"] == "abort" and resumed["prompt_tokens"] > 40
    # all of prompt + generated (what the router had received) found cached: nothing prefilled
    assert resumed["cached_tokens"] == resumed["prompt_tokens"]


def test_the_router_passes_its_key_as_the_engines_priority(engines) -> None:
    with serve(engines[:1], placement="least_load", scheduler="pps") as http:
        complete(http, "p1", [21] * 20, 5)
        complete(http, "p2", [22] * 20, 5)
        for key in ("p1", "p2"):
            http.post(f"/v1/trajectories/{key}/end")
    got = [r["priority"] for r in log(engines[0])[-2:]]
    assert all(isinstance(p, int) for p in got) and any(p != 0 for p in got), got


def test_an_abort_through_the_router_returns_what_was_generated(engines) -> None:
    with serve(engines, placement="least_load", scheduler="fcfs") as http:
        body = {"prompt": [31] * 30, "max_tokens": 4000, "ignore_eos": True,
                "return_token_ids": True, "request_id": "ab-1"}  # fmt: skip
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(http.post("/v1/completions", json=body)
                                                       .json()))  # fmt: skip
        t.start()
        deadline = time.monotonic() + 60
        while sum(e["tokens"] for e in http.get("/v1/stats").json()["engines"].values()) < 10:
            assert time.monotonic() < deadline, "the turn never decoded"
            time.sleep(0.02)
        assert http.post("/abort_requests", json={"request_ids": ["cmpl-ab-1-0"]}).json() == {
            "status": "aborted",
            "aborted": 1,
        }
        t.join(60)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "abort"
    assert 0 < len(choice["token_ids"]) < 4000
    assert choice["token_ids"] == reference([31] * 30, len(choice["token_ids"]))[0]
    deadline = time.monotonic() + 30
    while any(  # stopped at the engine too
        httpx.get(e.url + "/debug/stats").json()["running"] for e in engines
    ):
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.parametrize("move_kv", [True, False])
def test_a_moved_trajectory_finds_its_context_cached_where_it_moved(engines, move_kv) -> None:
    """Every tool call moves the trajectory to the other engine: with its KV copied there
    meanwhile, each next turn finds its whole context cached, and its tokens and logprobs are
    those of a run that never moved; without the copy it prefills everything again."""
    cfg = RolloutServerConfig(
        port=0,
        engines=tuple(EngineConfig(url=e.url, max_running=8) for e in engines),
        placement="least_load",
        scheduler="fcfs",
        move_kv=move_kv,
    )
    base = 2003 if move_kv else 2011  # (told apart in the engines' logs by length)
    ctx = [1 + (i * 37 + base) % 5000 for i in range(base)]
    lengths = []
    with (
        BackgroundRouter(cfg, RolloutDriver(cfg, router=Across())) as r,
        httpx.Client(base_url=r.url, timeout=300) as http,
    ):
        for step in range(3):
            lengths.append(len(ctx))
            choice = complete(http, f"mv{move_kv}", ctx, 40, logprobs=1)
            assert (choice["token_ids"], choice["logprobs"]["token_logprobs"]) == reference(ctx, 40)
            ctx += choice["token_ids"] + [9 + step] * 20  # the tool's reply
            time.sleep(0.5)  # the tool call: the copy runs meanwhile
        counts = http.get("/v1/stats").json()["policy"]
        http.post(f"/v1/trajectories/mv{move_kv}/end")
    where = {
        r["prompt_tokens"]: (i, r["cached_tokens"])
        for i, e in enumerate(engines)
        for r in log(e)
        if r["prompt_tokens"] in lengths
    }
    assert [where[n][0] for n in lengths] == [0, 1, 0]  # it moved at every tool call
    cached = [where[n][1] for n in lengths[1:]]
    if move_kv:
        # one copy after each turn (the router cannot tell the last one from the others)
        assert counts["kv_copies"] == 3 and counts["kv_copies_failed"] == 0
        assert cached == [lengths[0] + 40, lengths[1] + 40]  # the whole context found there
    else:
        assert counts["kv_copies"] == 0 and counts["migrations"] >= 2
        assert cached[0] == 0  # the other engine never saw it
