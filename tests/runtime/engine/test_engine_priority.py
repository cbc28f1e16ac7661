"""An engine started with priority scheduling (`--priority`, one request running at a time):
waiting requests are admitted by their `priority` (lower first), and a waiting one can be
aborted before it generates anything."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from engine_http import PROMPT, Background, abort, client, completion

from loom.runtime.engine import INSTALL_HINT, EngineProcess, engine_available

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(not engine_available(), reason=f"vLLM is not installed: {INSTALL_HINT}"),
]


# NOTE: timing races are avoided with vLLM's dev routes: `POST /pause?mode=keep` holds every
# new request in the waiting queue until `POST /resume`, and `/load` (with
# --enable-server-load-tracking) counts the requests the server holds, so the test knows they
# arrived. On two loaded cores a /metrics call can stall for seconds; no gauge is polled.
# The engine runs the heavy model: with the tiny one a token costs the engine core about what
# the API server spends on it, a starved API server fell seconds behind, and both answers left
# it together when it caught up (CI saw them 3 ms apart, in either order).
GEN = 600  # tokens each: ~7 s apart at the end on the heavy model


@pytest.fixture(scope="module")
def engine(heavy_engine: dict[str, Any]) -> Iterator[EngineProcess]:
    with EngineProcess.start(
        priority=True,
        max_running=1,
        **heavy_engine,
        extra_args=("--enable-server-load-tracking",),
    ) as eng:
        yield eng


def _timed(url: str, **body: object) -> tuple[float, dict[str, object]]:
    with client() as http:
        out = completion(http, url, prompt=PROMPT, ignore_eos=True, **body)
    return time.monotonic(), out


def _wait_held(http: httpx.Client, url: str, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (load := http.get(f"{url}/load").json()["server_load"]) < n:
        assert time.monotonic() < deadline, f"server holds {load} < {n} requests"
        time.sleep(0.05)
    time.sleep(0.5)  # from the HTTP handler into the engine's queue


def test_waiting_requests_are_admitted_by_priority(engine: EngineProcess) -> None:
    with client() as http:
        assert http.post(f"{engine.url}/pause", params={"mode": "keep"}).status_code == 200
        low = Background(lambda: _timed(engine.url, max_tokens=GEN, priority=10))
        _wait_held(http, engine.url, 1)
        high = Background(lambda: _timed(engine.url, max_tokens=GEN, priority=-10))
        _wait_held(http, engine.url, 2)
        assert http.post(f"{engine.url}/resume").status_code == 200
        (t_low, _), (t_high, _) = low.result(), high.result()
    # one slot: the later request with the lower value ran first
    assert t_high < t_low


def test_a_waiting_request_can_be_aborted(engine: EngineProcess) -> None:
    with client() as http:
        assert http.post(f"{engine.url}/pause", params={"mode": "keep"}).status_code == 200
        queued = Background(lambda: _timed(engine.url, max_tokens=8, request_id="w-queued"))
        _wait_held(http, engine.url, 1)
        assert abort(http, engine.url, "cmpl-w-queued-0").status_code == 200
        _, body = queued.result()
        assert http.post(f"{engine.url}/resume").status_code == 200
    choice = body["choices"][0]  # type: ignore[index]
    assert choice["finish_reason"] == "abort"
    assert choice["token_ids"] == []
    assert body["usage"]["completion_tokens"] == 0  # type: ignore[index]
