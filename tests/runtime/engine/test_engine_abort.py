"""Aborting and resuming a turn on the real engine: an abort stops generation early and the
client keeps the tokens generated so far; a resumed request asks only for what is missing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from engine_http import (
    PROMPT,
    Background,
    Stream,
    abort,
    client,
    completion,
    metric,
    stream_completion,
    wait_metric,
)

from loom.runtime.engine import INSTALL_HINT, EnginePool, EngineProcess, engine_available

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(not engine_available(), reason=f"vLLM is not installed: {INSTALL_HINT}"),
]

LONG = 4000  # tokens: most of a minute on the heavy model, far longer than an abort takes


@pytest.fixture(scope="module")
def engine(heavy_engine_pool: EnginePool) -> EngineProcess:
    return heavy_engine_pool.get(1)[0]


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with client() as c:
        yield c


def _abort_after(http: httpx.Client, url: str, rid: str, n: int) -> object:
    """An `on_tokens` callback that aborts `cmpl-{rid}-0` once `n` tokens have arrived."""
    sent: list[httpx.Response] = []

    def on_tokens(out: Stream) -> None:
        if len(out.tokens) >= n and not sent:
            sent.append(abort(http, url, f"cmpl-{rid}-0"))

    on_tokens.sent = sent  # type: ignore[attr-defined]
    return on_tokens


def test_abort_stops_a_stream_and_keeps_its_tokens(engine: EngineProcess) -> None:
    with client() as http, client() as control:
        on_tokens = _abort_after(control, engine.url, "abort-stream", 16)
        out = stream_completion(
            http,
            engine.url,
            on_tokens,  # type: ignore[arg-type]
            prompt=PROMPT,
            max_tokens=LONG,
            ignore_eos=True,
            request_id="abort-stream",
        )
    (answer,) = on_tokens.sent  # type: ignore[attr-defined]
    assert answer.status_code == 200
    assert out.status == 200 and out.done
    assert 16 <= len(out.tokens) < LONG
    last = out.choice_chunks[-1]["choices"][0]
    # the stream ends with one chunk of finish_reason "abort" and no tokens, then usage
    assert last["finish_reason"] == "abort"
    assert last["token_ids"] == [] and last["text"] == ""
    assert out.usage is not None and out.usage["completion_tokens"] == len(out.tokens)
    # the partial tokens are the greedy continuation's prefix
    with client() as http:
        whole = completion(http, engine.url, prompt=PROMPT, max_tokens=len(out.tokens))
    assert whole["choices"][0]["token_ids"] == out.tokens


def test_abort_of_a_plain_request_returns_its_partial_tokens(
    engine: EngineProcess, http: httpx.Client
) -> None:
    with client() as runner:
        prompted = metric(http, engine.url, "prompt_tokens_total")
        job = Background(
            lambda: completion(
                runner,
                engine.url,
                prompt=PROMPT,
                max_tokens=LONG,
                ignore_eos=True,
                request_id="abort-plain",
            )
        )
        wait_metric(http, engine.url, "prompt_tokens_total", prompted + len(PROMPT))
        assert abort(http, engine.url, "cmpl-abort-plain-0").status_code == 200
        body = job.result()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "abort"
    assert 0 < len(choice["token_ids"]) < LONG
    assert body["usage"]["completion_tokens"] == len(choice["token_ids"])


def test_abort_answers_200_whatever_it_aborted(engine: EngineProcess, http: httpx.Client) -> None:
    # "aborted" counts the ids sent, not the requests found: the answer proves nothing
    resp = abort(http, engine.url, "cmpl-no-such-request-0")
    assert resp.status_code == 200
    assert resp.json() == {"status": "aborted", "aborted": 1}


def test_an_empty_id_list_aborts_everything(engine: EngineProcess, http: httpx.Client) -> None:
    with client() as a, client() as b:
        prompted = metric(http, engine.url, "prompt_tokens_total")
        jobs = [
            Background(
                lambda c=c, i=i: completion(
                    c, engine.url, prompt=PROMPT, max_tokens=LONG, ignore_eos=True, request_id=i
                )
            )
            for c, i in ((a, "all-1"), (b, "all-2"))
        ]
        wait_metric(http, engine.url, "prompt_tokens_total", prompted + 2 * len(PROMPT))
        resp = http.post(f"{engine.url}/abort_requests", json={"request_ids": []})
        assert resp.status_code == 200
        reasons = [job.result()["choices"][0]["finish_reason"] for job in jobs]
    assert reasons == ["abort", "abort"]


def test_resume_asks_only_for_the_missing_tokens(engine: EngineProcess) -> None:
    wanted = 1000  # 11 s of decoding: the engine may run seconds past the abort when stalled
    with client() as http, client() as control:
        on_tokens = _abort_after(control, engine.url, "resume-1", 24)
        first = stream_completion(
            http,
            engine.url,
            on_tokens,  # type: ignore[arg-type]
            prompt=PROMPT,
            max_tokens=wanted,
            ignore_eos=True,
            request_id="resume-1",
        )
        assert first.finish_reason == "abort"
        partial = first.tokens
        assert 24 <= len(partial) < wanted
        rest = completion(
            http,
            engine.url,
            prompt=PROMPT + partial,
            max_tokens=wanted - len(partial),
            ignore_eos=True,
            request_id="resume-2",
        )
        checked = len(partial) + 64  # greedy: a prefix of the uninterrupted turn is enough
        straight = completion(http, engine.url, prompt=PROMPT, max_tokens=checked, ignore_eos=True)
    choice = rest["choices"][0]
    assert choice["finish_reason"] == "length"
    assert len(choice["token_ids"]) == wanted - len(partial)
    assert rest["usage"]["prompt_tokens"] == len(PROMPT) + len(partial)
    # the resumed turn continues the uninterrupted one
    assert (partial + choice["token_ids"])[:checked] == straight["choices"][0]["token_ids"]
