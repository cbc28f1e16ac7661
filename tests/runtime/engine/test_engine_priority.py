"""An engine started with priority scheduling (`--priority`, one request running at a time):
waiting requests are admitted by their `priority` (lower first) and a waiting one can be
aborted before it generates anything."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from engine_http import PROMPT, Background, abort, client, completion

from loom.runtime.engine import INSTALL_HINT, EngineProcess, engine_available

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(not engine_available(), reason=f"vLLM is not installed: {INSTALL_HINT}"),
]


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    with EngineProcess.start(priority=True, max_running=1) as eng:
        yield eng


def _wait_gauge(http: httpx.Client, url: str, name: str, n: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in http.get(f"{url}/metrics").text.splitlines():
            if line.startswith(f"vllm:{name}{{") and float(line.split()[-1]) >= n:
                return
        time.sleep(0.05)
    raise AssertionError(f"vllm:{name} stayed below {n} for {timeout_s} s")


def _timed(url: str, **body: object) -> tuple[float, dict[str, object]]:
    with client() as http:
        out = completion(http, url, prompt=PROMPT, ignore_eos=True, **body)
    return time.monotonic(), out


def test_waiting_requests_are_admitted_by_priority(engine: EngineProcess) -> None:
    with client() as http:
        head = Background(lambda: _timed(engine.url, max_tokens=400, request_id="p-head"))
        _wait_gauge(http, engine.url, "num_requests_running", 1)
        low = Background(lambda: _timed(engine.url, max_tokens=8, priority=10, request_id="p-low"))
        _wait_gauge(http, engine.url, "num_requests_waiting", 1)
        high = Background(lambda: _timed(engine.url, max_tokens=8, priority=-10, request_id="p-hi"))
        _wait_gauge(http, engine.url, "num_requests_waiting", 2)
        (t_head, first), (t_low, _), (t_high, _) = head.result(), low.result(), high.result()
    # the running request kept its slot; of the two waiting, the lower value went first
    assert first["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert t_head < t_high < t_low


def test_a_waiting_request_can_be_aborted(engine: EngineProcess) -> None:
    with client() as http:
        head = Background(lambda: _timed(engine.url, max_tokens=3000, request_id="w-head"))
        _wait_gauge(http, engine.url, "num_requests_running", 1)
        queued = Background(lambda: _timed(engine.url, max_tokens=8, request_id="w-queued"))
        _wait_gauge(http, engine.url, "num_requests_waiting", 1)
        abort(http, engine.url, "cmpl-w-queued-0")
        _, body = queued.result()
        abort(http, engine.url, "cmpl-w-head-0")
        _, head_body = head.result()
    choice = body["choices"][0]  # type: ignore[index]
    assert choice["finish_reason"] == "abort"
    assert choice["token_ids"] == []
    assert body["usage"]["completion_tokens"] == 0  # type: ignore[index]
    assert head_body["choices"][0]["finish_reason"] == "abort"  # type: ignore[index]
