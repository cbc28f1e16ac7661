"""The router in front of real vLLM engines (the `engine` extra: vLLM's CPU build on the tiny
model): a multi-turn trajectory through the OpenAI API, preemption with exact resume, and an
engine killed mid-turn. Greedy decoding makes a resumed turn comparable token for token with
an uninterrupted one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from loom.proc.shm import mapped_shm
from loom.proc.tether import group_members
from loom.runtime.engine import INSTALL_HINT, EnginePool, EngineProcess, engine_available
from loom.runtime.rollout import BackgroundRouter, EngineConfig, RolloutServerConfig

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(not engine_available(), reason=f"vLLM is not installed: {INSTALL_HINT}"),
]


@pytest.fixture(scope="module")
def engines(engine_pool: EnginePool) -> list[EngineProcess]:
    return engine_pool.get(2)


@pytest.fixture(scope="module")
def heavy_engines(heavy_engine_pool: EnginePool) -> list[EngineProcess]:
    return heavy_engine_pool.get(2)


@contextlib.contextmanager
def _serve(engines: list[EngineProcess], settings: dict) -> Iterator[httpx.Client]:
    settings = dict(settings)
    max_running = settings.pop("max_running", 8)
    n = settings.pop("engines", len(engines))
    cfg = RolloutServerConfig(
        port=0,
        engines=tuple(EngineConfig(url=e.url, max_running=max_running) for e in engines[:n]),
        health_interval_s=1.0,
        **settings,
    )
    with BackgroundRouter(cfg) as r, httpx.Client(base_url=r.url, timeout=300) as http:
        yield http


@pytest.fixture
def router(engines: list[EngineProcess], request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    with _serve(engines, getattr(request, "param", {})) as http:
        yield http


@pytest.fixture
def heavy_router(heavy_engines: list[EngineProcess]) -> Iterator[httpx.Client]:
    """cache_aware + fcfs over the heavy engines: a turn decodes for seconds, not a blink."""
    with _serve(heavy_engines, {"placement": "cache_aware", "scheduler": "fcfs"}) as http:
        yield http


def _complete(
    http: httpx.Client, key: str | None, prompt: list[int], n: int, **extra: object
) -> dict:
    headers = {"X-Trajectory-Id": key} if key else {}
    body = {
        "prompt": prompt,
        "max_tokens": n,
        "ignore_eos": True,
        "temperature": 0,
        "return_token_ids": True,
        **extra,
    }
    resp = http.post("/v1/completions", json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _reference(engine: EngineProcess, prompt: list[int], n: int) -> list[int]:
    return _reference_logprobs(engine, prompt, n)[0]


def _reference_logprobs(
    engine: EngineProcess, prompt: list[int], n: int
) -> tuple[list[int], list[float]]:
    """An uninterrupted turn straight at the engine: its tokens and their logprobs."""
    body = {
        "model": engine.model_name,
        "prompt": prompt,
        "max_tokens": n,
        "ignore_eos": True,
        "temperature": 0,
        "return_token_ids": True,
        "logprobs": 0,
    }
    out = httpx.post(engine.url + "/v1/completions", json=body, timeout=300).json()
    choice = out["choices"][0]
    return list(choice["token_ids"]), list(choice["logprobs"]["token_logprobs"])


def test_a_multi_turn_trajectory_through_the_openai_api(router: httpx.Client) -> None:
    batch = {"trajectories": [{"id": "agent-1", "prompt": "fix the bug"}]}
    assert router.post("/v1/rollouts", json=batch).status_code == 201
    messages = [{"role": "user", "content": "bada bezo"}]
    for turn in range(3):
        resp = router.post(
            "/v1/chat/completions",
            json={"messages": messages, "max_tokens": 8, "temperature": 0},
            headers={"X-Trajectory-Id": "agent-1"},
        )
        assert resp.status_code == 200, resp.text
        reply = resp.json()["choices"][0]["message"]
        assert reply["role"] == "assistant" and reply["content"]
        messages += [reply, {"role": "user", "content": f"tool said {turn}"}]
    view = router.get("/v1/trajectories/agent-1").json()
    assert view["turns"] == 3 and view["generated"] == 24 and view["declared"] is True
    assert router.post("/v1/trajectories/agent-1/end").status_code == 200
    stats = router.get("/v1/stats").json()
    assert stats["policy"]["turns"] == 3 and stats["policy"]["finished"] == 1
    assert {e["kind"] for e in stats["engines"].values()} == {"vllm"}


def test_preemption_on_vllm_resumes_with_exactly_the_missing_tokens(
    heavy_engines: list[EngineProcess],
) -> None:
    """On the heavy model (11 ms a token): with the tiny one a loaded machine let the long turn
    finish before the fresh one arrived, and nothing was preempted."""
    settings = {"engines": 1, "max_running": 1, "placement": "least_load", "scheduler": "pps"}
    n = 1200
    with _serve(heavy_engines, settings) as router:
        first = _complete(router, "long", [1, 2, 3, 4], 4)["choices"][0]["token_ids"]
        prompt = [1, 2, 3, 4, *first, 5]
        out: dict = {}
        worker = threading.Thread(
            target=lambda: out.update(_complete(router, "long", prompt, n, logprobs=0))
        )
        worker.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the long turn is decoding
            if router.get("/v1/stats").json()["engines"]["e0"]["tokens"] >= 4 + 20:
                break
            time.sleep(0.05)
        fresh = _complete(router, "fresh", [9, 9, 9], 6)  # on its first step: outranks under PPS
        worker.join(300)
        stats = router.get("/v1/stats").json()
        assert stats["policy"]["preemptions"] >= 1
        assert fresh["usage"]["completion_tokens"] == 6
        choice = out["choices"][0]
        assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == n
        tokens, logprobs = _reference_logprobs(heavy_engines[0], prompt, n)
        assert choice["token_ids"] == tokens
        # every token's logprob, under the engine that sampled it, across the preemption: the
        # resumed part was computed after a prefill of prompt + generated, not step by step
        got = choice["logprobs"]["token_logprobs"]
        assert len(got) == n
        worst = max(abs(a - b) for a, b in zip(got, logprobs, strict=True))
        assert worst < 1e-2, worst
        for key in ("long", "fresh"):
            router.post(f"/v1/trajectories/{key}/end")


@pytest.mark.may_skip_in_ci  # the engine may finish the turn before the kill: a race
def test_a_turn_survives_its_vllm_engine_being_killed(
    heavy_router: httpx.Client, heavy_engines: list[EngineProcess]
) -> None:
    """On the heavy model (17 s for the turn), so that the turn is still decoding when its
    engine dies however loaded the machine; the module's heavy engines stop with it."""
    router, n = heavy_router, 1500
    prompt = [7, 8, 9, 10]
    expected = _reference(heavy_engines[0], prompt, n)
    # declared alone, cache_aware pins it to the first engine
    batch = {"trajectories": [{"id": "k", "prompt_id": 1}]}
    assert router.post("/v1/rollouts", json=batch).json()["plan"] == {"k": "e0"}
    victim = heavy_engines[0]
    tokens: list[int] = []
    finish: list[str] = []

    def turn() -> None:  # streamed: the test sees tokens as the router relays them
        body = {
            "prompt": prompt,
            "max_tokens": n,
            "ignore_eos": True,
            "temperature": 0,
            "return_token_ids": True,
            "stream": True,
        }
        with router.stream(
            "POST", "/v1/completions", json=body, headers={"X-Trajectory-Id": "k"}
        ) as resp:
            for line in resp.iter_lines():
                if line.startswith("data:") and "choices" in line:
                    for choice in json.loads(line[5:])["choices"]:
                        tokens.extend(choice.get("token_ids") or [])
                        if choice.get("finish_reason"):
                            finish.append(choice["finish_reason"])

    worker = threading.Thread(target=turn)
    worker.start()
    # the router's own view, not the client's (which may lag it): decoding at e0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        view = router.get("/v1/trajectories/k").json()
        tokens_at_e0 = router.get("/v1/stats").json()["engines"]["e0"]["tokens"]
        if "running" in view["states"] and tokens_at_e0 >= 30:
            break
        time.sleep(0.01)
    if "running" not in view["states"]:  # the stand-in tests cover this case deterministically
        worker.join(300)
        pytest.skip("the engine finished the turn before the test saw it running (timing)")
    host = "e0"
    os.killpg(victim.pid, signal.SIGKILL)  # no graceful drain: the engine dies mid-turn
    worker.join(300)
    assert finish == ["length"] and len(tokens) == n
    assert tokens == expected  # every token once, in order, as if nothing had happened
    stats = router.get("/v1/stats").json()
    assert stats["policy"]["failovers"] >= 1 and stats["engines"][host]["alive"] is False
    router.post("/v1/trajectories/k/end")


def test_rose_moves_a_turn_off_a_lent_vllm_engine_killed_mid_turn(
    heavy_engine_pool: EnginePool,
) -> None:
    """`--placement rose` over a dedicated and a lent vLLM engine, one running turn per GPU:
    a turn streams on the lent engine (the dedicated one is busy), the lent engine dies, and
    the turn waits in the central queue until the dedicated engine frees, then finishes there
    with exactly the tokens an uninterrupted one has. (After the test above: `get` restarts
    the engine it killed.)"""
    dedicated, lent = heavy_engine_pool.get(2)
    n = 800  # about 9 s a turn on the heavy model
    busy, prompt = [3, 1, 4, 1], [2, 7, 1, 8]
    expected = _reference(dedicated, prompt, n)
    cfg = RolloutServerConfig(
        port=0,
        engines=(
            EngineConfig(url=dedicated.url, max_running=8),
            EngineConfig(url=lent.url, max_running=8, lent=True),
        ),
        placement="rose",
        rose_cap_per_gpu=1,
        health_interval_s=1.0,
    )
    with BackgroundRouter(cfg) as r, httpx.Client(base_url=r.url, timeout=300) as http:
        first = threading.Thread(target=_complete, args=(http, "busy", busy, n))
        first.start()
        deadline = time.monotonic() + 120
        while http.get("/v1/stats").json()["engines"]["e0"]["tokens"] < 1:
            assert time.monotonic() < deadline, "the dedicated engine never started"
            time.sleep(0.05)
        out: dict = {}
        second = threading.Thread(
            target=lambda: out.update(_complete(http, "moved", prompt, n)), daemon=True
        )
        second.start()
        deadline = time.monotonic() + 300  # the lent engine may be the one `get` restarted
        while http.get("/v1/stats").json()["engines"]["e1"]["tokens"] < 30:
            assert time.monotonic() < deadline, "the lent engine never took the turn"
            time.sleep(0.01)
        shm = set().union(*(mapped_shm(p) for p in group_members(lent.pid)))
        os.killpg(lent.pid, signal.SIGKILL)
        second.join(300)
        first.join(300)
        assert out["choices"][0]["token_ids"] == expected  # every token once, in order
        stats = http.get("/v1/stats").json()
        assert stats["engines"]["e1"]["alive"] is False
        assert stats["policy"]["failovers"] >= 1 and stats["policy"]["held"] >= 1
        for key in ("busy", "moved"):
            http.post(f"/v1/trajectories/{key}/end")
    # killed, its engine core unlinked none of its message queues: stopping it removes them
    assert shm and all(f.exists() for f in shm), shm
    lent.stop()
    assert not [f for f in shm if f.exists()]
