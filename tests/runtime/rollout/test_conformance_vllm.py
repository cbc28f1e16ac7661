"""Conformance over real vLLM CPU engines: the exact requests of slime's rollout
(`slime/rollout/sglang_rollout.py`: `input_ids`, its nine sampling fields, `return_logprob`,
tokens read from `meta_info.output_token_logprobs`), slime's end-of-step abort loop
(`slime_replay.abort_until_idle`: `GET /workers`, then `POST {url}/abort_request
{"abort_all"}` and `GET {url}/v1/loads?include=core` per url), and the official `openai`
client (logprobs, n, streaming, chat), answered in the shapes they parse, with logprobs equal
to vLLM's own for the same request."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import slime_replay as slime

from loom.runtime.engine import INSTALL_HINT, EnginePool, EngineProcess, engine_available
from loom.runtime.rollout import BackgroundRouter, EngineConfig, RolloutServerConfig
from loom.runtime.rollout.engines import vllm_load

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(not engine_available(), reason=f"vLLM is not installed: {INSTALL_HINT}"),
]

# NOTE: logprobs of one request computed twice by vLLM's CPU build (fp32) differ only by the
# batch they were computed in
TOL = 1e-3


@pytest.fixture(scope="module")
def engines(engine_pool: EnginePool) -> list[EngineProcess]:
    return engine_pool.get(2)


@pytest.fixture(scope="module")
def router(engines: list[EngineProcess]) -> Iterator[BackgroundRouter]:
    cfg = RolloutServerConfig(
        port=0,
        engines=tuple(EngineConfig(url=e.url, max_running=4) for e in engines),
        placement="least_load",
        health_interval_s=1.0,
    )
    with BackgroundRouter(cfg) as r:
        yield r


def _http(r: BackgroundRouter) -> httpx.Client:
    return httpx.Client(base_url=r.url, timeout=300)


def slime_sampling(max_new: int) -> dict[str, Any]:
    """`GenerateState.__init__`'s sampling_params: every key, always (stop may be null)."""
    return {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": max_new,
        "stop": None,
        "stop_token_ids": None,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }


def vllm_direct(engine: EngineProcess, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """The same request straight to vLLM: its tokens and logprobs."""
    out = httpx.post(
        engine.url + "/v1/completions",
        json={
            "model": engine.model_name,
            "prompt": prompt,
            "max_tokens": n,
            "temperature": 0,
            "logprobs": 0,
            "return_token_ids": True,
            "ignore_eos": True,
        },
        timeout=300,
    ).json()["choices"][0]
    return out["token_ids"], out["logprobs"]["token_logprobs"]


def test_slimes_rollout_request_and_parsing(router: BackgroundRouter, engines) -> None:
    prompt = [5, 17, 42, 8, 99]
    body = {"sampling_params": slime_sampling(12), "return_logprob": True, "input_ids": prompt}
    with _http(router) as http:
        output = http.post("/generate", json=body).json()
    # slime's parsing (sglang_rollout.py, Sample.update_from_meta_info)
    meta = output["meta_info"]
    tokens = [item[1] for item in meta["output_token_logprobs"]]
    log_probs = [item[0] for item in meta["output_token_logprobs"]]
    assert tokens == output["output_ids"] and len(tokens) == meta["completion_tokens"]
    assert isinstance(output["text"], str) and output["text"]
    assert meta["finish_reason"]["type"] in ("length", "stop")
    assert isinstance(meta["weight_version"], str)
    assert meta["prompt_tokens"] == len(prompt) and "cached_tokens" in meta
    direct_tokens, direct_lps = vllm_direct(engines[0], prompt, len(tokens))
    assert tokens == direct_tokens[: len(tokens)]
    assert all(abs(a - b) < TOL for a, b in zip(log_probs, direct_lps, strict=False))


def _vllm_busy(engines: list[EngineProcess]) -> int:
    """Requests running or waiting in the engines themselves, by their /metrics."""
    loads = [vllm_load(httpx.get(e.url + "/metrics", timeout=30).content) for e in engines]
    return sum(x.running + x.waiting for x in loads)


def test_slimes_abort_loop_through_the_router(heavy_engine_pool: EnginePool) -> None:
    """On the heavy model (11 ms a token alone, more batched): with the tiny one a loaded
    machine starved the router and its client for 8-17 s at a time while an engine decoded
    all 3000 tokens (about 8 s), so some turns had ended 'length' before the abort reached
    the router. The first abort must find all six in flight; every one ends abort with what
    it generated, and nothing runs on the engines afterwards."""
    engines = heavy_engine_pool.get(2)
    cfg = RolloutServerConfig(
        port=0,
        engines=tuple(EngineConfig(url=e.url, max_running=4) for e in engines),
        placement="least_load",
        health_interval_s=1.0,
    )
    with BackgroundRouter(cfg) as router, _http(router) as http, ThreadPoolExecutor(6) as pool:
        body = {
            "sampling_params": {**slime_sampling(3000), "ignore_eos": True},
            "return_logprob": True,
            "input_ids": [3, 4, 5],
        }
        futures = [pool.submit(http.post, "/generate", json=body) for _ in range(6)]
        # generous: two vLLM engines share two cores with the rest of the suite
        deadline = time.monotonic() + 300
        while True:  # all six in flight (slime aborts what it has sent), some tokens out
            stats = http.get("/v1/stats").json()
            tokens = sum(e["tokens"] for e in stats["engines"].values())
            if stats["trajectories"]["in_flight"] == 6 and tokens >= 20:
                break
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)
        # NOTE: slime launches SGLang engines, which answer its abort and its loads at their
        # own urls; vLLM's answer neither, so those loops give up (as slime's do, after its
        # post's retries: one here) and the router's own entry reaches every turn
        own, *rest = slime.abort_until_idle(router.url, interval_s=0.1, retries=1)
        outs = [f.result(120).json() for f in futures]
        aborted = [a["aborted"] for a in own.aborts]
        assert own.gave_up is None and own.loads[-1] == 0
        assert aborted[0] == 6, f"turns had ended before the abort: {aborted}, {outs}"
        assert sum(aborted) == 6
        assert [loop.url for loop in rest] == [e.url for e in engines]
        assert all(loop.gave_up for loop in rest)
    for out in outs:
        meta = out["meta_info"]
        assert meta["finish_reason"]["type"] == "abort"  # a 200 with what it generated
        assert len(meta["output_token_logprobs"]) == len(out["output_ids"]) < 3000
    deadline = time.monotonic() + 60
    while _vllm_busy(engines):  # the router aborted every request it had sent
        assert time.monotonic() < deadline, "requests still run on the engines after the abort"
        time.sleep(0.2)


def test_the_openai_client(router: BackgroundRouter, engines) -> None:
    import openai

    client = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0)
    model = engines[0].model_name
    out = client.completions.create(
        model=model,
        prompt="bila benu defi",
        max_tokens=6,
        temperature=0,
        logprobs=2,
        n=2,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in out.choices] == [0, 1]
    lp = out.choices[0].logprobs
    assert lp is not None and len(lp.tokens) == 6 == len(lp.token_logprobs)
    assert all(len(top) <= 3 for top in lp.top_logprobs)  # the sampled token and 2 more
    assert out.choices[0].text == out.choices[1].text  # greedy: siblings agree
    assert out.usage.completion_tokens == 12
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "defi duli"}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 5 and all(len(c.top_logprobs) == 2 for c in content)
    assert "".join(c.token for c in content).replace(" ", "") == chat.choices[
        0
    ].message.content.replace(" ", "")
    pieces, finish = [], None
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "defi duli"}],
        max_tokens=5,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    ):
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            finish = c.finish_reason or finish
        usage = chunk.usage or None
    assert "".join(pieces) == chat.choices[0].message.content and finish == "length"
    assert usage is not None and usage.completion_tokens == 5
    stats = httpx.get(router.url + "/v1/stats").json()
    assert stats["tokenizer"] is not None  # the router tokenized: no engine round trip
    assert stats["policy"]["engine_tokenized"] == 0


def test_local_tokenization_equals_the_engines(router: BackgroundRouter, engines) -> None:
    tok = router.driver.tokenizer
    assert tok is not None
    url = engines[0].url
    for prompt in ("defi duli fofi", "bila  benu\tdefi"):
        want = httpx.post(url + "/tokenize", json={"prompt": prompt}).json()["tokens"]
        assert tok.encode(prompt) == want
    for messages in (
        [{"role": "user", "content": "defi duli"}],
        [
            {"role": "system", "content": "bila"},
            {"role": "user", "content": "benu"},
            {"role": "assistant", "content": "fofi"},
            {"role": "user", "content": "defi"},
        ],
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "defi"}, {"type": "text", "text": "duli"}],
            }
        ],
    ):
        want = httpx.post(
            url + "/tokenize", json={"messages": messages, "add_generation_prompt": True}
        ).json()
        assert tok.chat({"messages": messages}) == want["tokens"]


def test_prompt_logprobs_and_sglang_scoring(router: BackgroundRouter, engines) -> None:
    """A distillation-style scoring request (slime's on-policy distillation): the prompt's
    logprobs, max_new_tokens 0."""
    prompt = [5, 17, 42, 8, 99, 7]
    with _http(router) as http:
        out = http.post(
            "/generate",
            json={
                "input_ids": prompt,
                "return_logprob": True,
                "logprob_start_len": 0,
                "sampling_params": {"temperature": 0, "max_new_tokens": 0},
            },
        ).json()
        oa = http.post(
            "/v1/completions", json={"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 1}
        ).json()["choices"][0]
    rows = out["meta_info"]["input_token_logprobs"]
    assert out["output_ids"] == [] and [r[1] for r in rows] == prompt and rows[0][0] is None
    direct = httpx.post(
        engines[0].url + "/v1/completions",
        json={
            "model": engines[0].model_name,
            "prompt": prompt,
            "max_tokens": 1,
            "prompt_logprobs": 0,
        },
    ).json()["choices"][0]["prompt_logprobs"]
    for i in range(1, len(prompt)):
        want = direct[i][str(prompt[i])]["logprob"]
        assert math.isclose(rows[i][0], want, abs_tol=TOL)
        assert math.isclose(oa["prompt_logprobs"][i][str(prompt[i])]["logprob"], want, abs_tol=TOL)


def test_a_streamed_sglang_request_is_cumulative(router: BackgroundRouter) -> None:
    """slime's streaming rollout reads text and logprobs as cumulative in every chunk."""
    body = {
        "input_ids": [3, 9, 27],
        "sampling_params": slime_sampling(8),
        "return_logprob": True,
        "stream": True,
    }
    chunks = []
    with _http(router) as http, http.stream("POST", "/generate", json=body) as s:
        import json

        for line in s.iter_lines():
            if line.startswith("data:") and not line.endswith("[DONE]"):
                chunks.append(json.loads(line[5:]))
    last = chunks[-1]
    for c in chunks:
        n = len(c["output_ids"])
        assert c["output_ids"] == last["output_ids"][:n]
        assert len(c["meta_info"]["output_token_logprobs"]) == n
    assert last["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_weights_versions_reach_the_response(router: BackgroundRouter) -> None:
    with _http(router) as http:
        ids = [e["id"] for e in http.get("/v1/engines").json()["engines"]]
        assert http.put("/v1/weights", json={"version": 3, "engines": ids}).status_code == 200
        out = http.post(
            "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}
        ).json()
    assert out["meta_info"]["weight_version"] == "3"


def test_a_hung_engine_never_holds_a_text_request(engines) -> None:
    """An engine stopped with SIGSTOP: text requests (tokenized by the router) and their
    turns go to the other engine; nothing waits on the stopped one for long."""
    import os
    import signal

    cfg = RolloutServerConfig(
        port=0,
        engines=tuple(EngineConfig(url=e.url, max_running=4) for e in engines),
        placement="least_load",
        health_interval_s=0.5,
        health_failures=2,
    )
    victim = engines[1]
    with BackgroundRouter(cfg) as r, _http(r) as http:
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(4) as pool:
                outs = list(
                    pool.map(
                        lambda i: http.post(
                            "/v1/completions",
                            json={"prompt": f"defi duli {'bila ' * i}", "max_tokens": 4},
                        ),
                        range(6),
                    )
                )
        finally:
            os.kill(victim.pid, signal.SIGCONT)
        assert [o.status_code for o in outs] == [200] * 6, [o.text for o in outs]
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
