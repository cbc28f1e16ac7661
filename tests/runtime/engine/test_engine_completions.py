"""Token-in/token-out completions on the real engine: the shapes the router relies on."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from engine_http import MODEL, PROMPT, client, completion, stream_completion

from loom.runtime.engine import INSTALL_HINT, EnginePool, EngineProcess, engine_available

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not engine_available(), reason=f"vLLM is not installed: {INSTALL_HINT}"),
]


@pytest.fixture(scope="module")
def engine(engine_pool: EnginePool) -> EngineProcess:
    return engine_pool.get(1)[0]


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with client() as c:
        yield c


def test_models_lists_the_tiny_model(engine: EngineProcess, http: httpx.Client) -> None:
    models = http.get(f"{engine.url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == [MODEL]
    assert http.get(f"{engine.url}/health").status_code == 200


def test_token_ids_in_token_ids_out(engine: EngineProcess, http: httpx.Client) -> None:
    body = completion(http, engine.url, prompt=PROMPT, max_tokens=12, ignore_eos=True)
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == PROMPT
    assert len(choice["token_ids"]) == 12
    assert choice["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == len(PROMPT)
    assert body["usage"]["completion_tokens"] == 12
    # a batch of prompts: one choice per prompt, in order; the id names the request
    body = completion(
        http, engine.url, prompt=[PROMPT, PROMPT[:3]], max_tokens=4, request_id="batch-1"
    )
    assert body["id"] == "cmpl-batch-1"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["token_ids"] == choice["token_ids"][:4]  # greedy, deterministic


def test_engine_serves_the_model_transformers_runs(
    engine: EngineProcess, http: httpx.Client
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    root = http.get(f"{engine.url}/v1/models").json()["data"][0]["root"]
    model = AutoModelForCausalLM.from_pretrained(root)
    want = model.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False)
    got = completion(http, engine.url, prompt=PROMPT, max_tokens=16, ignore_eos=True)
    assert got["choices"][0]["token_ids"] == want[0, len(PROMPT) :].tolist()


def test_stream_chunks_carry_token_ids(engine: EngineProcess, http: httpx.Client) -> None:
    whole = completion(http, engine.url, prompt=PROMPT, max_tokens=10, ignore_eos=True)
    out = stream_completion(http, engine.url, prompt=PROMPT, max_tokens=10, ignore_eos=True)
    assert out.status == 200 and out.done
    first, *rest = out.choice_chunks
    assert first["choices"][0]["prompt_token_ids"] == PROMPT  # the first chunk only
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in rest)
    assert all(c["choices"][0]["finish_reason"] is None for c in out.choice_chunks[:-1])
    assert out.tokens == whole["choices"][0]["token_ids"]
    assert out.finish_reason == "length"
    # include_usage: a last chunk with no choices and the usage
    assert out.chunks[-1]["choices"] == []
    assert out.usage is not None and out.usage["completion_tokens"] == 10


def test_stop_token_ends_with_stop(engine: EngineProcess, http: httpx.Client) -> None:
    tokens = completion(http, engine.url, prompt=PROMPT, max_tokens=10, ignore_eos=True)["choices"][
        0
    ]["token_ids"]
    stop = tokens[5]
    choice = completion(
        http, engine.url, prompt=PROMPT, max_tokens=10, ignore_eos=True, stop_token_ids=[stop]
    )["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop
    assert choice["token_ids"] == tokens[: tokens.index(stop) + 1]  # the stop token is included


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
        ({"prompt": PROMPT, "max_tokens": -1}, "max_tokens"),
        ({"prompt": [5, 10**6], "max_tokens": 2}, "out of vocabulary"),
        ({"prompt": PROMPT, "max_tokens": 10**5}, "max_model_len"),
    ],
)
def test_bad_requests_are_400(
    engine: EngineProcess, http: httpx.Client, body: dict[str, object], message: str
) -> None:
    resp = http.post(f"{engine.url}/v1/completions", json={"model": MODEL, **body})
    assert resp.status_code == 400
    assert message in resp.json()["error"]["message"]


def test_a_request_priority_is_accepted(engine: EngineProcess, http: httpx.Client) -> None:
    body = completion(http, engine.url, prompt=PROMPT, max_tokens=2, priority=5)
    assert body["choices"][0]["finish_reason"] == "length"
